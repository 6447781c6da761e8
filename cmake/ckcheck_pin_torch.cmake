# LibTorch from pip torch, pinned: pip's TorchConfig.cmake finds its Caffe2 package and its libraries
# with PATHS, which CMake searches only after the system folders, so another LibTorch on the machine
# (Debian's libtorch-dev in /usr/lib) is found first and linked in its place. This sets Caffe2_DIR
# and the library variables TorchConfig reads to the LibTorch whose Torch folder is TORCH_CMAKE_DIR
# (TORCH/share/cmake/Torch), unless the caller set them.
macro(ckcheck_pin_torch torch_cmake_dir)
  get_filename_component(_ckcheck_torch_share "${torch_cmake_dir}/.." ABSOLUTE)
  get_filename_component(_ckcheck_torch_lib "${torch_cmake_dir}/../../../lib" ABSOLUTE)
  if(NOT Caffe2_DIR AND EXISTS "${_ckcheck_torch_share}/Caffe2/Caffe2Config.cmake")
    set(Caffe2_DIR "${_ckcheck_torch_share}/Caffe2" CACHE PATH "pip torch's Caffe2 (ckcheck_pin_torch)")
  endif()
  foreach(_ckcheck_pair "TORCH_LIBRARY;torch" "c10_LIBRARY;c10" "C10_CUDA_LIBRARY;c10_cuda"
                        "CAFFE2_NVRTC_LIBRARY;caffe2_nvrtc" "kineto_LIBRARY;kineto")
    list(GET _ckcheck_pair 0 _ckcheck_var)
    list(GET _ckcheck_pair 1 _ckcheck_name)
    find_library(${_ckcheck_var} ${_ckcheck_name} PATHS "${_ckcheck_torch_lib}" NO_DEFAULT_PATH)
  endforeach()
endmacro()
