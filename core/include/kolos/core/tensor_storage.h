// Freeing and re-allocating a tensor's memory in place, for tensors whose
// data is needed only part of the time (ZeRO-3's gathered parameters, a
// pipeline stage's copy of another stage's parameters).
//
// The tensor keeps its shape, dtype and identity; every view of it and every
// tensor autograd saved from it share the StorageImpl, so they lose and
// regain the data together. Reading a freed tensor's data is an error (its
// storage holds no memory). Not thread-safe with respect to other users of
// the same storage.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>

#include <cstddef>

namespace kolos {

// Releases `t`'s memory (its storage keeps no bytes).
inline void free_storage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, s->device()));
  s->set_nbytes(0);
}

// Gives `t`'s storage memory for its elements again (uninitialised), from
// the storage's own allocator.
inline void allocate_storage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  const size_t nbytes = static_cast<size_t>(t.numel()) * t.element_size();
  s->set_data_ptr_noswap(s->allocator()->allocate(nbytes));
  s->set_nbytes(nbytes);
}

}  // namespace kolos
