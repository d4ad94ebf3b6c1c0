# kvtier._kvtier_cuda (python/kvtier/_cuda_ext.cc): the CUDA copier for vLLM's worker, built when both the Python
# package and CUDA are enabled (included from the top-level CMakeLists.txt after nanobind has been found).
nanobind_add_module(_kvtier_cuda NB_STATIC ${PROJECT_SOURCE_DIR}/python/kvtier/_cuda_ext.cc)
target_link_libraries(_kvtier_cuda PRIVATE kvtier_cuda CUDA::cudart)
kvtier_shared_libstdcxx(_kvtier_cuda)  # CMakeLists.txt: one libstdc++ in the process
install(TARGETS _kvtier_cuda LIBRARY DESTINATION kvtier)
