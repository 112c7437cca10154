# A program answers --help and -h with its usage and exit status 0, and an unknown option with
# a message naming it and a non-zero status. Run as cmake -DPROGRAM=... -P help_test.cmake.
foreach(flag --help -h)
  execute_process(COMMAND ${PROGRAM} ${flag} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err TIMEOUT 30)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${PROGRAM} ${flag} exited with ${rc} (expected 0):\n${out}\n${err}")
  endif()
  if(NOT out MATCHES "[Uu]sage")
    message(FATAL_ERROR "${PROGRAM} ${flag} printed no usage on stdout:\n${out}\n${err}")
  endif()
endforeach()
execute_process(COMMAND ${PROGRAM} --no-such-option RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err TIMEOUT 30)
if(rc EQUAL 0 OR NOT err MATCHES "--no-such-option")
  message(FATAL_ERROR "${PROGRAM} --no-such-option exited with ${rc} (expected non-zero, with a "
                      "message naming the option on stderr):\n${out}\n${err}")
endif()
message(STATUS "${PROGRAM}: --help, -h and an unknown option answered as expected")
