cmake_minimum_required(VERSION 3.25)
# Fails when a file of floor FLOOR includes a floor that is not below it
# (BELOW: the floors it stands on, all the way down). Run by the build for
# each floor (CMakeLists.txt); writes STAMP when the floor is clean.
set(allowed ${FLOOR} ${BELOW})
set(errors "")
foreach(file IN LISTS FILES)
  file(STRINGS "${file}" includes REGEX "^[ \t]*#[ \t]*include[ \t]*<sac/")
  foreach(line IN LISTS includes)
    string(REGEX MATCH "<sac/([a-z_]+)/" _ "${line}")
    set(included "${CMAKE_MATCH_1}")
    if(included STREQUAL "" AND line MATCHES "<sac/sac.h>")
      set(included "sac.h")
    endif()
    if(NOT included IN_LIST allowed)
      string(APPEND errors "  ${file}: ${line}\n")
    endif()
  endforeach()
endforeach()
if(errors)
  string(REPLACE ";" ", " below "${BELOW}")
  message(FATAL_ERROR
    "sac/${FLOOR} stands on [${below}] only, but includes a floor above or beside it:\n"
    "${errors}"
    "Move what it needs down to a floor below, or the code up to a floor above "
    "(the floors: CMakeLists.txt, SAC_STANDS_ON_*).")
endif()
file(WRITE "${STAMP}" "")
