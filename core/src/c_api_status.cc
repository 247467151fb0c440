// C API: version, status names, the thread-local last error and the argument
// checks shared by the handle files.
#include <cstdio>
#include <string>

#include "c_api_internal.h"

namespace paternoster::c_api {
namespace {
// Fixed size, so recording an error never allocates (or throws).
thread_local char t_last_error[512] = "";
}  // namespace

[[noreturn]] void raise(pn_status_t status, std::string message) {
  throw Error{status, std::move(message)};
}

pn_status_t set_error(pn_status_t status, const char* fn, const char* message) noexcept {
  std::snprintf(t_last_error, sizeof(t_last_error), "%s: %s", fn, message);
  return status;
}

void clear_error() noexcept { t_last_error[0] = '\0'; }

void check_out(const void* out, const char* what) {
  if (out == nullptr) raise(PN_ERR_INVALID_ARGUMENT, std::string(what) + " is NULL");
}

void check_array(const void* data, int64_t n, const char* what) {
  if (n < 0) {
    raise(PN_ERR_INVALID_ARGUMENT,
          std::string(what) + ": negative count " + std::to_string(n));
  }
  if (n > 0 && data == nullptr) {
    raise(PN_ERR_INVALID_ARGUMENT,
          std::string(what) + " is NULL with count " + std::to_string(n));
  }
}

}  // namespace paternoster::c_api

extern "C" {

uint32_t pn_version(void) noexcept { return PN_VERSION; }

const char* pn_status_string(pn_status_t status) noexcept {
  switch (status) {
    case PN_OK: return "PN_OK";
    case PN_ERR_INVALID_ARGUMENT: return "PN_ERR_INVALID_ARGUMENT";
    case PN_ERR_OUT_OF_BLOCKS: return "PN_ERR_OUT_OF_BLOCKS";
    case PN_ERR_NOT_FOUND: return "PN_ERR_NOT_FOUND";
    case PN_ERR_ALREADY_EXISTS: return "PN_ERR_ALREADY_EXISTS";
    case PN_ERR_BUFFER_TOO_SMALL: return "PN_ERR_BUFFER_TOO_SMALL";
    case PN_ERR_OUT_OF_MEMORY: return "PN_ERR_OUT_OF_MEMORY";
    case PN_ERR_INTERNAL: return "PN_ERR_INTERNAL";
  }
  return "PN_ERR_UNKNOWN";
}

const char* pn_last_error_message(void) noexcept { return paternoster::c_api::t_last_error; }

}  // extern "C"
