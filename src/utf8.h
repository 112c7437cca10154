#pragma once
// UTF-8 validation for text that becomes JSON keys (a metrics key, a safetensors tensor name):
// such text is refused, not repaired, as two different invalid keys could repair to one.
#include <cstdint>
#include <string_view>

namespace galley::detail {

// Whether `s` is well-formed UTF-8: no stray continuation bytes, no truncated sequences, no
// overlong encodings, no surrogates, nothing past U+10FFFF.
inline bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<uint8_t>(s[i]);
    int extra = 0;
    uint32_t cp = 0, least = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      extra = 1, cp = c & 0x1F, least = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2, cp = c & 0x0F, least = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3, cp = c & 0x07, least = 0x10000;
    } else {
      return false;
    }
    if (s.size() - i <= size_t(extra)) return false;
    for (int k = 1; k <= extra; ++k) {
      const auto b = static_cast<uint8_t>(s[i + k]);
      if ((b & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (b & 0x3F);
    }
    if (cp < least || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += size_t(extra) + 1;
  }
  return true;
}

}  // namespace galley::detail
