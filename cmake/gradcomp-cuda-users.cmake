# Where gradcomp is a subproject without gradcomp::cuda (CUDA not enabled, or no toolkit or CCCL
# found), a parent target that links gradcomp::cuda would stop the build at generate time with
# CMake's "links to target gradcomp::cuda but the target was not found". This check runs at the
# end of the parent's configure instead and names the target and what is missing. It sees the
# targets that link gradcomp::cuda themselves; one reached through another INTERFACE target still
# gets CMake's message (and the configure log's "gradcomp: no gradcomp::cuda in this build" line).

# Schedules the check at the end of the top-level directory, with the reason gradcomp::cuda is missing.
function(gradcomp_check_cuda_users_later reason)
  set_property(GLOBAL PROPERTY GRADCOMP_CUDA_MISSING "${reason}")
  cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL gradcomp_check_cuda_users)
endfunction()

# Stops the configure if a target of the build links gradcomp::cuda.
function(gradcomp_check_cuda_users)
  get_property(reason GLOBAL PROPERTY GRADCOMP_CUDA_MISSING)
  set(directories "${CMAKE_SOURCE_DIR}")
  while(directories)
    list(POP_FRONT directories directory)
    get_property(subdirectories DIRECTORY "${directory}" PROPERTY SUBDIRECTORIES)
    list(APPEND directories ${subdirectories})
    get_property(targets DIRECTORY "${directory}" PROPERTY BUILDSYSTEM_TARGETS)
    foreach(target IN LISTS targets)
      get_target_property(links ${target} LINK_LIBRARIES)
      get_target_property(interface_links ${target} INTERFACE_LINK_LIBRARIES)
      if("${links};${interface_links}" MATCHES "(^|[;:<>])gradcomp::cuda([;>]|$)")
        message(FATAL_ERROR "${target} links gradcomp::cuda, which this build does not define: ${reason}")
      endif()
    endforeach()
  endwhile()
endfunction()
