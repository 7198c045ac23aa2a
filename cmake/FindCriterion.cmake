# FindCriterion.cmake — finds the Criterion unit-test framework (Debian: libcriterion-dev).
#
# Uses pkg-config when available, then plain find_path/find_library (honouring Criterion_ROOT).
# Provides:
#   Criterion_FOUND, Criterion_VERSION, Criterion_INCLUDE_DIRS, Criterion_LIBRARIES
#   the imported target Criterion::Criterion

find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
    pkg_check_modules(PC_Criterion QUIET criterion)
endif()

find_path(Criterion_INCLUDE_DIR
    NAMES criterion/criterion.h
    HINTS ${PC_Criterion_INCLUDEDIR} ${PC_Criterion_INCLUDE_DIRS})
find_library(Criterion_LIBRARY
    NAMES criterion
    HINTS ${PC_Criterion_LIBDIR} ${PC_Criterion_LIBRARY_DIRS})

if(PC_Criterion_VERSION)
    set(Criterion_VERSION "${PC_Criterion_VERSION}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Criterion
    REQUIRED_VARS Criterion_LIBRARY Criterion_INCLUDE_DIR
    VERSION_VAR Criterion_VERSION
    REASON_FAILURE_MESSAGE "install the Debian package libcriterion-dev (apt-get install libcriterion-dev)")

if(Criterion_FOUND)
    set(Criterion_INCLUDE_DIRS "${Criterion_INCLUDE_DIR}")
    set(Criterion_LIBRARIES "${Criterion_LIBRARY}")
    if(NOT TARGET Criterion::Criterion)
        add_library(Criterion::Criterion UNKNOWN IMPORTED)
        set_target_properties(Criterion::Criterion PROPERTIES
            IMPORTED_LOCATION "${Criterion_LIBRARY}"
            INTERFACE_INCLUDE_DIRECTORIES "${Criterion_INCLUDE_DIR}")
        # pkg-config's extra flags (Debian's criterion.pc adds -DBXF_STATIC_LIB=1).
        if(PC_Criterion_CFLAGS_OTHER)
            set_property(TARGET Criterion::Criterion PROPERTY
                INTERFACE_COMPILE_OPTIONS ${PC_Criterion_CFLAGS_OTHER})
        endif()
    endif()
endif()

mark_as_advanced(Criterion_INCLUDE_DIR Criterion_LIBRARY)
