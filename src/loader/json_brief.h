// A bounded, non-recursive rendering of a JSON value for error messages. nlohmann's dump()
// recurses once per nesting level, so dumping a hostile value (a header or config entry nested a
// million levels deep) would overflow the stack instead of reporting the error.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace wren {

/// Scalars as written (cut to 80 characters); lists by their first 8 top-level entries, with
/// nested lists/objects shown as "[...]"/"{...}"; objects as "{...}".
inline std::string json_brief(const nlohmann::json& v) {
  auto scalar = [](const nlohmann::json& x) {
    if (x.is_array()) return std::string("[...]");
    if (x.is_object()) return std::string("{...}");
    std::string s = x.dump();
    if (s.size() > 80) {  // appended in place: GCC 12's -Wrestrict misfires on operator+ here
      s.resize(77);
      s += "...";
    }
    return s;
  };
  if (!v.is_array()) return scalar(v);
  std::string s = "[";
  for (size_t i = 0; i < v.size() && i < 8; ++i) {
    if (i) s += ',';
    s += scalar(v[i]);
  }
  s += v.size() > 8 ? ",...]" : "]";
  return s;
}

}  // namespace wren
