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

# SIGTERM as soon as the first progress line of epoch 1 is out (10 steps in, of 47): the signal
# lands mid-epoch however slow the machine is. The shell prints the run's exit status.
set(log ${WORK_DIR}/preempted.log)
string(REPLACE ";" " " args "${common}")
execute_process(
  COMMAND sh -c "\"$0\" ${args} --checkpoint-dir \"$1\"/b --metrics \"$1\"/b.jsonl >\"$2\" 2>&1 &
pid=$!
i=0
until grep -q 'epoch 1/2 .*/3000' \"$2\"; do
  i=$((i + 1))
  if [ $i -gt 3000 ] || ! kill -0 $pid 2>/dev/null; then echo 'no progress line'; exit 1; fi
  sleep 0.02
done
kill -TERM $pid
wait $pid
echo \"status $?\""
          ${EXAMPLE} ${WORK_DIR} ${log}
  RESULT_VARIABLE rc OUTPUT_VARIABLE status)
file(READ ${log} text)
if(NOT rc EQUAL 0 OR NOT status MATCHES "status 75")
  message(FATAL_ERROR "the run sent SIGTERM did not exit with 75 (${rc}, ${status}):\n${text}")
endif()
if(NOT text MATCHES "preempted by SIGTERM: checkpoint saved")
  message(FATAL_ERROR "the preempted run did not report its checkpoint:\n${text}")
endif()

execute_process(COMMAND ${EXAMPLE} ${common} --checkpoint-dir ${WORK_DIR}/b --resume
                        --metrics ${WORK_DIR}/b.jsonl
                RESULT_VARIABLE rc OUTPUT_VARIABLE text ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "resumed run failed (${rc}):\n${text}\n${err}")
endif()
string(REGEX MATCH "resumed in epoch [0-9]+ after batch [0-9]+" where "${text}")
if(where STREQUAL "")
  message(FATAL_ERROR "the resumed run did not continue mid-epoch:\n${text}")
endif()
results(${WORK_DIR}/b.jsonl "${text}" resumed)

if(NOT straight STREQUAL resumed OR NOT straight MATCHES "final test accuracy")
  message(FATAL_ERROR "preempted and resumed run differs:\n  straight: ${straight}\n"
                      "  resumed:  ${resumed}")
endif()
message(STATUS "${where}; identical: ${resumed}")
