#pragma once
// The switches that choose how the GPU libraries compute (read by the cuBLAS and cuDNN calls,
// kept in every build so that the public setters read back what was set).
namespace galley::kernels {

// Lets cuBLAS and cuDNN use TF32 tensor cores for float32 (faster, ~1e-3 relative error).
void set_allow_tf32(bool on);
bool allow_tf32();
// Restricts convolutions to cuDNN algorithms that give the same bits at every run.
void set_deterministic(bool on);
bool deterministic();

}  // namespace galley::kernels
