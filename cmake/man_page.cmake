# Makes one man page with help2man from the program's own --help and --version (one source:
# the options are described once, where they are parsed) and a file of what --help does not
# say (docs/man/NAME.h2m: description, environment, files, exit status, see also), run by the
# target `man` (docs/man/CMakeLists.txt):
#   cmake -DHELP2MAN=... -DPROGRAM=<binary> -DNAME=<page name> -DSECTION=1|8 -DINCLUDE=<.h2m>
#         -DOUT=<page.SECTION.gz> [-DCOMMANDS=ON] [-DHELP_OPTION=...] [-DVERSION_OPTION=...]
#         -P cmake/man_page.cmake
# COMMANDS=ON adds a COMMANDS section with each subcommand's --help (and its subcommands'),
# as `neffcache COMMAND --help` prints it. The page is compressed as Debian installs pages
# (gzip -9n: no name or time in the header, so the same page gives the same bytes).
cmake_minimum_required(VERSION 3.25)

foreach(var HELP2MAN PROGRAM NAME SECTION INCLUDE OUT)
  if(NOT ${var})
    message(FATAL_ERROR "man_page.cmake: pass -D${var}=...")
  endif()
endforeach()
if(NOT HELP_OPTION)
  set(HELP_OPTION --help)
endif()
if(NOT VERSION_OPTION)
  set(VERSION_OPTION --version)
endif()

get_filename_component(dir "${OUT}" DIRECTORY)
file(MAKE_DIRECTORY "${dir}")
set(includes --include "${INCLUDE}")

# A program's help as roff that shows it as printed: no fill, backslashes and leading dots
# or quotes escaped, the program's path (in "Usage:") cut to its name.
function(help_as_roff words out_var)
  execute_process(COMMAND ${words} --help OUTPUT_VARIABLE help RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "man_page.cmake: '${words} --help' failed (${rc})")
  endif()
  string(REPLACE "${PROGRAM}" "${NAME}" help "${help}")
  string(REPLACE "\\" "\\e" help "${help}")
  string(REGEX REPLACE "(^|\n)([.'])" "\\1\\\\&\\2" help "${help}")
  set(${out_var} "${help}" PARENT_SCOPE)
endfunction()

# The subcommands a help lists: the first word of each line under "Subcommands:".
function(subcommands_of help out_var)
  set(names "")
  if(help MATCHES "\nSubcommands:\n(.*)$")
    string(REPLACE "\n" ";" lines "${CMAKE_MATCH_1}")
    foreach(line IN LISTS lines)
      if(line MATCHES "^  ([a-z][a-z0-9-]*) ")
        list(APPEND names "${CMAKE_MATCH_1}")
      elseif(NOT line MATCHES "^ ")
        break()
      endif()
    endforeach()
  endif()
  set(${out_var} "${names}" PARENT_SCOPE)
endfunction()

if(COMMANDS)
  set(text "[COMMANDS]\n")
  help_as_roff("${PROGRAM}" top)
  subcommands_of("${top}" commands)
  if(NOT commands)
    message(FATAL_ERROR "man_page.cmake: '${PROGRAM} --help' lists no subcommands")
  endif()
  foreach(command IN LISTS commands)
    help_as_roff("${PROGRAM};${command}" help)
    string(APPEND text ".SS \"${NAME} ${command}\"\n.nf\n${help}.fi\n")
    subcommands_of("${help}" inner)
    foreach(sub IN LISTS inner)
      help_as_roff("${PROGRAM};${command};${sub}" help)
      string(APPEND text ".SS \"${NAME} ${command} ${sub}\"\n.nf\n${help}.fi\n")
    endforeach()
  endforeach()
  file(WRITE "${OUT}.commands.h2m" "${text}")
  list(APPEND includes --include "${OUT}.commands.h2m")
endif()

# The version alone, the last word of the first line: help2man would copy every line the
# program prints (neffcachefs names its libfuse; neffcache-cc the compiler this machine has).
execute_process(COMMAND "${PROGRAM}" ${VERSION_OPTION} OUTPUT_VARIABLE said RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT said MATCHES "^[^\n]* ([^ \n]+)\n")
  message(FATAL_ERROR "man_page.cmake: '${PROGRAM} ${VERSION_OPTION}' said no version")
endif()
set(version "${CMAKE_MATCH_1}")
string(REGEX REPLACE "\\.gz$" "" page "${OUT}")
execute_process(COMMAND "${HELP2MAN}" --no-info --section=${SECTION} --help-option=${HELP_OPTION}
                        --version-string=${version} ${includes} --output=${page} "${PROGRAM}"
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "man_page.cmake: help2man failed for ${PROGRAM} (${rc})")
endif()
execute_process(COMMAND gzip -9nf "${page}" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "man_page.cmake: gzip failed for ${page}")
endif()
