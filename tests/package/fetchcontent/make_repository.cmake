# cmake -DSOURCE_DIR=<gradcomp> -DREPOSITORY=<new folder> -DTAG=<tag> -DGIT=<git> -P make_repository.cmake
# Makes REPOSITORY a git repository of SOURCE_DIR's files with one commit tagged TAG. In a git
# checkout the files are those a commit of the working tree would hold (tracked and untracked, not
# ignored), edits included; elsewhere, what gradcomp as a subproject reads.
file(REMOVE_RECURSE "${REPOSITORY}")
file(MAKE_DIRECTORY "${REPOSITORY}")
execute_process(COMMAND "${GIT}" -C "${SOURCE_DIR}" ls-files --cached --others --exclude-standard
                RESULT_VARIABLE listed OUTPUT_VARIABLE files ERROR_QUIET)
if(listed EQUAL 0)
  string(REPLACE "\n" ";" files "${files}")
else()
  file(GLOB_RECURSE files RELATIVE "${SOURCE_DIR}" "${SOURCE_DIR}/include/*" "${SOURCE_DIR}/cmake/*")
  list(APPEND files CMakeLists.txt LICENSE CHANGELOG.md)
endif()
foreach(file IN LISTS files)
  if(file STREQUAL "" OR NOT EXISTS "${SOURCE_DIR}/${file}")  # a tracked file deleted in the working tree
    continue()
  endif()
  get_filename_component(folder "${REPOSITORY}/${file}" DIRECTORY)
  file(MAKE_DIRECTORY "${folder}")
  file(COPY_FILE "${SOURCE_DIR}/${file}" "${REPOSITORY}/${file}")
endforeach()
set(git "${GIT}" -C "${REPOSITORY}" -c user.name=gradcomp-tests -c user.email=tests@gradcomp.invalid
        -c init.defaultBranch=main -c commit.gpgsign=false -c tag.gpgsign=false)
foreach(step IN ITEMS "init -q" "add -A" "commit -q -m release" "tag -a ${TAG} -m ${TAG}")
  separate_arguments(arguments UNIX_COMMAND "${step}")
  execute_process(COMMAND ${git} ${arguments} RESULT_VARIABLE result)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "git ${step} failed in ${REPOSITORY}")
  endif()
endforeach()
