# cmake -P script of ditto_gtest_groups (Note [Grouped gtest ctests], gtest_groups.cmake): runs
# EXE --gtest_list_tests and writes OUT, one add_test a group of up to GROUP_SIZE cases of one
# suite, with TIMEOUT, SKIP_RETURN_CODE 77 and PROPERTIES (a list of name;value pairs).
execute_process(COMMAND "${EXE}" --gtest_list_tests OUTPUT_VARIABLE listing
                RESULT_VARIABLE rc ERROR_VARIABLE err TIMEOUT 120)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "ditto_gtest_groups: ${EXE} --gtest_list_tests exited with ${rc}: ${err}")
endif()
# Brackets in a parameter's printed value would end a bracket argument: none of the names
# (suites, cases) has one, and the comments after '#' are dropped.
string(REPLACE ";" "\\;" listing "${listing}")
string(REPLACE "\n" ";" lines "${listing}")

# The suites in gtest's order ("Suite." lines), each with its cases' full names (cases_<suite>).
set(suites "")
foreach(line IN LISTS lines)
  string(REGEX REPLACE " *#.*$" "" line "${line}")
  if(line MATCHES "^[^ ].*\\.$")
    set(suite "${line}")
    list(APPEND suites "${suite}")
    set(cases_${suite} "")
  elseif(line MATCHES "^  ([^ ]+)$")
    list(APPEND cases_${suite} "${suite}${CMAKE_MATCH_1}")
  endif()
endforeach()

function(quoted out value)  # a bracket argument, for any text without ]==]
  set(${out} "[==[${value}]==]" PARENT_SCOPE)
endfunction()
quoted(qexe "${EXE}")
set(qproperties "")
foreach(p IN LISTS PROPERTIES)
  quoted(qp "${p}")
  string(APPEND qproperties " ${qp}")
endforeach()

# "Suite.*" when the suite fits in one group, else "Suite.*#1", "Suite.*#2", ...
set(script "")
foreach(suite IN LISTS suites)
  list(LENGTH cases_${suite} n)
  set(part 0)
  foreach(first RANGE 0 ${n} ${GROUP_SIZE})
    if(first EQUAL n)
      break()
    endif()
    list(SUBLIST cases_${suite} ${first} ${GROUP_SIZE} group)
    math(EXPR part "${part} + 1")
    set(name "${suite}*")
    if(n GREATER GROUP_SIZE)
      set(name "${suite}*#${part}")
    endif()
    list(JOIN group ":" filter)
    quoted(qname "${name}")
    quoted(qfilter "--gtest_filter=${filter}")
    string(APPEND script "add_test(${qname} ${qexe} ${qfilter} --ditto_all_skipped_exit_code=77)\n"
           "set_tests_properties(${qname} PROPERTIES TIMEOUT ${TIMEOUT} SKIP_RETURN_CODE 77"
           "${qproperties})\n")
  endforeach()
endforeach()
file(WRITE "${OUT}" "${script}")
