// StorageDTypeScope and ConversionScope (mixed_precision.h): thread-local markers.
#include "core/runtime/mixed_precision.h"

namespace ditto {

namespace {
thread_local DType t_storage = DType::f32;
thread_local bool t_conversion = false;
}  // namespace

StorageDTypeScope::StorageDTypeScope(DType storage) noexcept
    : ThreadLocalScope(t_storage, storage) {}
DType current_storage_dtype() noexcept { return t_storage; }

ConversionScope::ConversionScope() noexcept : ThreadLocalScope(t_conversion, true) {}
bool in_conversion_scope() noexcept { return t_conversion; }

}  // namespace ditto
