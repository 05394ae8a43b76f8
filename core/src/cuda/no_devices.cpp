// Built instead of devices.cu when kolos is configured without CUDA.
#include "kolos/core/devices.h"

namespace kolos::cuda {

int device_count() noexcept { return 0; }
int select_device(int) { return -1; }
std::string device_name(int) { return "none"; }

}  // namespace kolos::cuda
