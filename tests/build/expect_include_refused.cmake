# Run by ctest (module_boundaries): builds each probe target of PROBES ("target=header;...") in
# BUILD_DIR and expects the compiler to refuse the header: each probe is one source file of a
# module that includes a header the module graph does not let it see. ALLOWED names a probe
# that includes only what its module may see and must build, so a refusal is not an accident
# of the probe set-up.
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target ${ALLOWED}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the allowed probe ${ALLOWED} did not build:\n${out}")
endif()
foreach(probe IN LISTS PROBES)
  string(REPLACE "=" ";" parts "${probe}")
  list(GET parts 0 target)
  list(GET parts 1 header)
  execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target ${target}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(rc EQUAL 0)
    message(FATAL_ERROR "${target}: including ${header} compiled, but the module graph forbids it")
  endif()
  string(FIND "${out}" "${header}: No such file" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${target} failed, but not by refusing ${header}:\n${out}")
  endif()
  message(STATUS "${target}: ${header} refused")
endforeach()
