// CheckpointError: the error kind of everything checkpoint (torch-free).
#pragma once

#include <string>

#include "kolos/core/error.h"

namespace kolos {

// A checkpoint that cannot be written, found, or read back as it should.
class CheckpointError : public Error {
 public:
  explicit CheckpointError(std::string message)
      : Error(std::move(message), ErrorKind::kCheckpoint) {}
};

}  // namespace kolos
