# joule_add_library(NAME [INTERFACE] [SOURCES a.cc b.cc ...])
# One library per folder: target joule_NAME, alias joule::NAME, sources included as
# "folder/file.h" from the repository root. Folder libraries under worker/ are named
# worker_FOLDER (joule::worker_comm, joule::worker_train, ...). Dependencies are added by
# the caller with target_link_libraries: PUBLIC for what the library's headers include,
# PRIVATE for what only its .cc files include.
function(joule_add_library name)
  cmake_parse_arguments(ARG "INTERFACE" "" "SOURCES" ${ARGN})
  if(ARG_INTERFACE)
    add_library(joule_${name} INTERFACE)
    target_include_directories(joule_${name} INTERFACE ${PROJECT_SOURCE_DIR})
  else()
    add_library(joule_${name} STATIC ${ARG_SOURCES})
    target_include_directories(joule_${name} PUBLIC ${PROJECT_SOURCE_DIR})
  endif()
  add_library(joule::${name} ALIAS joule_${name})
endfunction()
