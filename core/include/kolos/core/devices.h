// GPU discovery for the runtime; implemented in devices.cu when CUDA is on,
// as "no GPU" otherwise.
#pragma once

#include <stdexcept>
#include <string>

namespace kolos::cuda {

int device_count() noexcept;
// Sets the current device to local_rank % device_count(); returns it, or -1
// when there is no GPU. Throws std::runtime_error when CUDA refuses.
int select_device(int local_rank);
std::string device_name(int device);

}  // namespace kolos::cuda
