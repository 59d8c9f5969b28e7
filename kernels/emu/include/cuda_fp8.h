// Stand-in for CUDA's <cuda_fp8.h> in the emulator build: the types it declares come
// from ../cuda_emu.h, which every emulator translation unit includes first.
#include "../cuda_emu.h"
