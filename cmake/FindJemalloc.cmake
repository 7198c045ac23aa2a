# FindJemalloc.cmake — finds jemalloc (Debian: libjemalloc-dev).
#
# Uses pkg-config when available, then plain find_path/find_library (honouring Jemalloc_ROOT).
# Provides:
#   Jemalloc_FOUND, Jemalloc_VERSION, Jemalloc_INCLUDE_DIRS, Jemalloc_LIBRARIES
#   the imported target Jemalloc::Jemalloc
# Installed next to gpupoolConfig.cmake, which uses it through find_dependency(Jemalloc).

find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
    pkg_check_modules(PC_Jemalloc QUIET jemalloc)
endif()

find_path(Jemalloc_INCLUDE_DIR
    NAMES jemalloc/jemalloc.h
    HINTS ${PC_Jemalloc_INCLUDEDIR} ${PC_Jemalloc_INCLUDE_DIRS})
find_library(Jemalloc_LIBRARY
    NAMES jemalloc
    HINTS ${PC_Jemalloc_LIBDIR} ${PC_Jemalloc_LIBRARY_DIRS})

if(PC_Jemalloc_VERSION)
    set(Jemalloc_VERSION "${PC_Jemalloc_VERSION}")
elseif(Jemalloc_INCLUDE_DIR AND EXISTS "${Jemalloc_INCLUDE_DIR}/jemalloc/jemalloc.h")
    file(STRINGS "${Jemalloc_INCLUDE_DIR}/jemalloc/jemalloc.h" _jemalloc_version_line
         REGEX "^#define JEMALLOC_VERSION \"[^\"]*\"")
    string(REGEX REPLACE "^#define JEMALLOC_VERSION \"([0-9.]+).*" "\\1" Jemalloc_VERSION
           "${_jemalloc_version_line}")
    unset(_jemalloc_version_line)
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Jemalloc
    REQUIRED_VARS Jemalloc_LIBRARY Jemalloc_INCLUDE_DIR
    VERSION_VAR Jemalloc_VERSION
    REASON_FAILURE_MESSAGE "install the Debian package libjemalloc-dev (apt-get install libjemalloc-dev)")

if(Jemalloc_FOUND)
    set(Jemalloc_INCLUDE_DIRS "${Jemalloc_INCLUDE_DIR}")
    set(Jemalloc_LIBRARIES "${Jemalloc_LIBRARY}")
    if(NOT TARGET Jemalloc::Jemalloc)
        add_library(Jemalloc::Jemalloc UNKNOWN IMPORTED)
        set_target_properties(Jemalloc::Jemalloc PROPERTIES
            IMPORTED_LOCATION "${Jemalloc_LIBRARY}"
            INTERFACE_INCLUDE_DIRECTORIES "${Jemalloc_INCLUDE_DIR}")
    endif()
endif()

mark_as_advanced(Jemalloc_INCLUDE_DIR Jemalloc_LIBRARY)
