# Runs two commands and checks that they print the same final parameter hashes.
#   cmake -DFIRST=<command> -DSECOND=<command> [-DDEMO=<gradcomp_train_demo> -DSTEPS=<S>] -P compare_hashes.cmake
# A command's arguments are separated by "|" (a ";" would split the -D value in add_test).
# FIRST and SECOND print "final parameter hash [NAME] HASH" lines (mpi_train). With DEMO instead of
# SECOND, each row NAME of FIRST is compared with `DEMO --row NAME --steps STEPS`.
cmake_minimum_required(VERSION 3.25)

# Runs a command (a ;-list), fails on a non-zero exit, and returns its output in `out`.
function(run_command out)
  execute_process(COMMAND ${ARGN} OUTPUT_VARIABLE text ERROR_VARIABLE errors RESULT_VARIABLE status)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "`${ARGN}` failed (${status}):\n${text}\n${errors}")
  endif()
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

# The "NAME=HASH" pairs of mpi_train's output, in order.
function(hashes_of text out)
  string(REGEX MATCHALL "final parameter hash \\[[^]]*\\] [0-9a-f]+" lines "${text}")
  set(pairs)
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "final parameter hash \\[([^]]*)\\] ([0-9a-f]+)" "\\1=\\2" pair "${line}")
    list(APPEND pairs "${pair}")
  endforeach()
  if(NOT pairs)
    message(FATAL_ERROR "no final parameter hash in:\n${text}")
  endif()
  set(${out} "${pairs}" PARENT_SCOPE)
endfunction()

string(REPLACE "|" ";" FIRST "${FIRST}")
string(REPLACE "|" ";" SECOND "${SECOND}")
run_command(first_text ${FIRST})
hashes_of("${first_text}" first)
if(DEFINED DEMO)
  set(second)
  foreach(pair IN LISTS first)
    string(REGEX REPLACE "=[0-9a-f]+$" "" name "${pair}")
    run_command(demo_text ${DEMO} --row "${name}" --steps ${STEPS})
    string(REGEX MATCH "parameter hash ([0-9a-f]+)" found "${demo_text}")
    list(APPEND second "${name}=${CMAKE_MATCH_1}")
  endforeach()
else()
  run_command(second_text ${SECOND})
  hashes_of("${second_text}" second)
endif()
if(NOT first STREQUAL second)
  string(REPLACE ";" "\n  " a "${first}")
  string(REPLACE ";" "\n  " b "${second}")
  message(FATAL_ERROR "the final parameter hashes differ:\nfirst:\n  ${a}\nsecond:\n  ${b}")
endif()
list(LENGTH first rows)
message(STATUS "${rows} rows: the same final parameter hashes")
