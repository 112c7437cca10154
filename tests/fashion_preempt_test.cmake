# A Fashion-MNIST run sent SIGTERM mid-epoch saves a checkpoint at the next step and exits with
# 75 (io::kPreemptedExitCode); restarted with --resume it continues mid-epoch and must end
# exactly like an uninterrupted run: the same epoch losses and accuracies to the last digit of
# the metrics log (full double precision) and the same final line.
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
set(common --epochs 2 --limit 3000 --workers 2 --log-every 10)

# The "event":"epoch" lines' loss and accuracy, and the final line without its timing.
function(results metrics text out)
  file(STRINGS ${metrics} lines REGEX "\"event\":\"epoch\"")
  set(found "")
  foreach(line IN LISTS lines)
    string(REGEX MATCH "\"loss\":[^,]*" loss "${line}")
    string(REGEX MATCH "\"accuracy\":[^,]*" accuracy "${line}")
    list(APPEND found "${loss} ${accuracy}")
  endforeach()
  string(REGEX MATCH "final test accuracy [^\n]*" final "${text}")
  string(REGEX REPLACE " in [0-9.]+ s" "" final "${final}")
  list(APPEND found "${final}")
  set(${out} "${found}" PARENT_SCOPE)
endfunction()

execute_process(COMMAND ${EXAMPLE} ${common} --checkpoint-dir ${WORK_DIR}/a
                        --metrics ${WORK_DIR}/a.jsonl
                RESULT_VARIABLE rc OUTPUT_VARIABLE text ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "uninterrupted run failed (${rc}):\n${text}\n${err}")
endif()
results(${WORK_DIR}/a.jsonl "${text}" straight)

# SIGTERM mid-epoch: the run sends it to itself after step 57 (epoch 2, batch 10 of 47), so
# the signal lands there however fast or slow the machine is.
set(log ${WORK_DIR}/preempted.log)
execute_process(COMMAND ${EXAMPLE} ${common} --checkpoint-dir ${WORK_DIR}/b
                        --metrics ${WORK_DIR}/b.jsonl --preempt-at 57
                RESULT_VARIABLE status OUTPUT_FILE ${log} ERROR_FILE ${log}.err)
file(READ ${log} text)
file(READ ${log}.err err)
if(NOT status EQUAL 75)
  message(FATAL_ERROR "the run sent SIGTERM did not exit with 75 (${status}):\n${text}\n${err}")
endif()
if(NOT "${text}${err}" MATCHES "preempted by SIGTERM: checkpoint saved")
  message(FATAL_ERROR "the preempted run did not report its checkpoint:\n${text}\n${err}")
endif()

execute_process(COMMAND ${EXAMPLE} ${common} --checkpoint-dir ${WORK_DIR}/b --resume
                        --metrics ${WORK_DIR}/b.jsonl
                RESULT_VARIABLE rc OUTPUT_VARIABLE text ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "resumed run failed (${rc}):\n${text}\n${err}")
endif()
string(REGEX MATCH "resumed in epoch [0-9]+ after batch [0-9]+" where "${text}")
if(NOT where STREQUAL "resumed in epoch 2 after batch 10")
  message(FATAL_ERROR "the resumed run did not continue mid-epoch:\n${text}")
endif()
results(${WORK_DIR}/b.jsonl "${text}" resumed)

if(NOT straight STREQUAL resumed OR NOT straight MATCHES "final test accuracy")
  message(FATAL_ERROR "preempted and resumed run differs:\n  straight: ${straight}\n"
                      "  resumed:  ${resumed}")
endif()
message(STATUS "${where}; identical: ${resumed}")
