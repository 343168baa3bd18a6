# Copies the repository's read-only data into a share/wren folder (build tree or install staging):
# data/* (files written by scripts/setup.sh) and models/* (committed models), when present.
# Usage: cmake -DSRC=<source dir> -DDST=<dest dir> -P copy_data.cmake
file(MAKE_DIRECTORY "${DST}")
foreach(sub data models)
  if(IS_DIRECTORY "${SRC}/${sub}")
    file(GLOB_RECURSE files RELATIVE "${SRC}/${sub}" "${SRC}/${sub}/*")
    foreach(f ${files})
      if(sub STREQUAL "models")
        set(out "${DST}/models/${f}")
      else()
        set(out "${DST}/${f}")
      endif()
      get_filename_component(d "${out}" DIRECTORY)
      file(MAKE_DIRECTORY "${d}")
      file(COPY_FILE "${SRC}/${sub}/${f}" "${out}" ONLY_IF_DIFFERENT)
    endforeach()
  endif()
endforeach()
