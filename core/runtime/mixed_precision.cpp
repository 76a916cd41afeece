// StorageDTypeScope and ConversionScope (mixed_precision.h): thread-local markers.
#include "core/runtime/mixed_precision.h"

namespace ditto {

namespace {
thread_local DType t_storage = DType::f32;
thread_local bool t_conversion = false;
}  // namespace

StorageDTypeScope::StorageDTypeScope(DType storage) noexcept : previous_(t_storage) {
  t_storage = storage;
}
StorageDTypeScope::~StorageDTypeScope() { t_storage = previous_; }
DType current_storage_dtype() noexcept { return t_storage; }

ConversionScope::ConversionScope() noexcept : previous_(t_conversion) { t_conversion = true; }
ConversionScope::~ConversionScope() { t_conversion = previous_; }
bool in_conversion_scope() noexcept { return t_conversion; }

}  // namespace ditto
