# The CANN toolkit (ASCEND_CANN_PACKAGE_PATH, default $ASCEND_HOME_PATH) and its ascendc.cmake
# (ascendc_library()), for the operator's build (CMakeLists.txt here) and the node-day probes'
# (../kernel/probes/CMakeLists.txt).
if(NOT DEFINED ASCEND_CANN_PACKAGE_PATH)
    if(DEFINED ENV{ASCEND_HOME_PATH})
        set(ASCEND_CANN_PACKAGE_PATH "$ENV{ASCEND_HOME_PATH}" CACHE PATH "CANN toolkit directory")
    else()
        message(FATAL_ERROR "ASCEND_HOME_PATH is not set: source CANN's set_env.sh first")
    endif()
endif()

# Its Ascend C cmake helpers moved between CANN releases.
foreach(candidate tools/tikcpp/ascendc_kernel_cmake compiler/tikcpp/ascendc_kernel_cmake
                  ascendc_devkit/tikcpp/samples/cmake)
    if(NOT ASCENDC_CMAKE_DIR AND EXISTS "${ASCEND_CANN_PACKAGE_PATH}/${candidate}/ascendc.cmake")
        set(ASCENDC_CMAKE_DIR "${ASCEND_CANN_PACKAGE_PATH}/${candidate}")
    endif()
endforeach()
if(NOT ASCENDC_CMAKE_DIR)
    message(FATAL_ERROR "ascendc.cmake not found under ${ASCEND_CANN_PACKAGE_PATH}: is the CANN toolkit "
                        "(with the Ascend C development kit) installed there?")
endif()
include(${ASCENDC_CMAKE_DIR}/ascendc.cmake)
