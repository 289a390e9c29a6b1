# lbbsp::core: the pure balancing core (predictors/, balancer/ with the sampling functions), installable with
# its headers under include/lbbsp/ and a CMake package (find_package(lbbsp CONFIG)). Its link interface holds
# only OpenMP (NARX fleets run their workers' updates in parallel); Eigen is used inside, never exposed.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

file(GLOB LBBSP_PREDICTORS_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/predictors/*.cpp)
file(GLOB LBBSP_BALANCER_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/balancer/*.cpp)
add_library(lbbsp_core STATIC ${LBBSP_PREDICTORS_SOURCES} ${LBBSP_BALANCER_SOURCES})
add_library(lbbsp::core ALIAS lbbsp_core)
# The names the runtime, tests and benchmarks link by: one library now.
add_library(lbbsp_predictors ALIAS lbbsp_core)
add_library(lbbsp_balancer ALIAS lbbsp_core)
set_target_properties(lbbsp_core PROPERTIES OUTPUT_NAME lbbsp_core EXPORT_NAME core POSITION_INDEPENDENT_CODE ON)
target_compile_features(lbbsp_core PUBLIC cxx_std_20)

configure_file(${PROJECT_SOURCE_DIR}/cmake/version.hpp.in ${PROJECT_BINARY_DIR}/include/lbbsp/version.hpp @ONLY)
target_include_directories(lbbsp_core PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
                                             $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
                                             $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/include>
                                             $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
# Eigen is header-only and used in .cpp files only: a build-time dependency, not one of the consumer's.
target_link_libraries(lbbsp_core PRIVATE $<BUILD_INTERFACE:Eigen3::Eigen> PUBLIC OpenMP::OpenMP_CXX)
# No errno from sqrt/log: lets the NARX Adam update vectorise (results are unchanged; nothing reads errno).
set_source_files_properties(${LBBSP_PREDICTORS_SOURCES} PROPERTIES COMPILE_OPTIONS -fno-math-errno)
# The same decisions from every build (-march=native with AVX-512 and FMA, the portable wheel, another node): no
# fused multiply-adds contracted from a*b+c, and Eigen's scalar path (its SIMD packets differ with the ISA and
# reorder sums). Without these lbbsp-gpu-model decided differently at iteration 17 on an AVX-512 node.
target_compile_options(lbbsp_core PRIVATE -ffp-contract=off)
target_compile_definitions(lbbsp_core PRIVATE EIGEN_DONT_VECTORIZE)

# ---- install: library, public headers, CMake package (component "core") ----
set(LBBSP_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/lbbsp)
install(TARGETS lbbsp_core EXPORT lbbspTargets COMPONENT core ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES ${PROJECT_SOURCE_DIR}/include/lbbsp/core.hpp ${PROJECT_BINARY_DIR}/include/lbbsp/version.hpp
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/lbbsp COMPONENT core)
install(FILES ${PROJECT_SOURCE_DIR}/balancer/balancer.hpp ${PROJECT_SOURCE_DIR}/balancer/assign.hpp
              ${PROJECT_SOURCE_DIR}/balancer/sampling.hpp
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/lbbsp/balancer COMPONENT core)
install(FILES ${PROJECT_SOURCE_DIR}/predictors/predictor.hpp
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/lbbsp/predictors COMPONENT core)
install(EXPORT lbbspTargets NAMESPACE lbbsp:: DESTINATION ${LBBSP_CMAKE_DIR} COMPONENT core)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/lbbspConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/lbbspConfig.cmake INSTALL_DESTINATION ${LBBSP_CMAKE_DIR})
# 0.x: a minor release may change the API, so only the same major.minor satisfies a request.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/lbbspConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/lbbspConfig.cmake ${PROJECT_BINARY_DIR}/lbbspConfigVersion.cmake
        DESTINATION ${LBBSP_CMAKE_DIR} COMPONENT core)
