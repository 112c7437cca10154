# A program given a bad option value refuses it up front: a non-zero status and a message on
# stderr naming the option. Run as cmake -DPROGRAM=... -DARGS=a,b,... -DEXPECT=... -P
# bad_value_test.cmake (ARGS comma-separated).
string(REPLACE "," ";" args "${ARGS}")
execute_process(COMMAND ${PROGRAM} ${args} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err TIMEOUT 30)
if(rc EQUAL 0 OR NOT err MATCHES "${EXPECT}")
  message(FATAL_ERROR "${PROGRAM} ${args} exited with ${rc} (expected non-zero, with a message "
                      "naming ${EXPECT} on stderr):\n${out}\n${err}")
endif()
message(STATUS "${PROGRAM} ${args}: refused (${err})")
