# A Fashion-MNIST run stopped after epoch 2 and resumed from its checkpoint must end exactly
# like an uninterrupted run: same final accuracy and last-epoch loss to the printed digit.
# EXTRA: more arguments for every run (--amp;fp16: the loss scaler's state goes through the
# checkpoint too).
file(REMOVE_RECURSE ${WORK_DIR})
set(common --epochs 3 --limit 2000 --workers 2 ${EXTRA})
function(run out)
  execute_process(COMMAND ${EXAMPLE} ${common} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE text
                  ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "fashion_mnist ${ARGN} failed (${rc}):\n${text}\n${err}")
  endif()
  string(REGEX MATCH "final test accuracy [^\n]*" line "${text}")
  set(${out} "${line}" PARENT_SCOPE)
endfunction()
run(straight --checkpoint-dir ${WORK_DIR}/a)
run(ignored --checkpoint-dir ${WORK_DIR}/b --stop-after 2)
run(resumed --checkpoint-dir ${WORK_DIR}/b --resume)
string(REGEX REPLACE " in [0-9.]+ s" "" straight "${straight}")
string(REGEX REPLACE " in [0-9.]+ s" "" resumed "${resumed}")
if(NOT straight STREQUAL resumed OR straight STREQUAL "")
  message(FATAL_ERROR "resumed run differs:\n  straight: ${straight}\n  resumed:  ${resumed}")
endif()
message(STATUS "identical: ${resumed}")
