#ifndef KVSERVE_COMMON_CHAT_TEMPLATE_JINJA_RENDER_H_
#define KVSERVE_COMMON_CHAT_TEMPLATE_JINJA_RENDER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chat_template/jinja_ast.h"
#include "common/chat_template/jinja_value.h"

namespace kvserve::jinja {

/// Bounds on one rendering, so untrusted inputs cannot make it run away.
struct RenderLimits {
  /// Largest output.
  size_t max_output_bytes = size_t{16} << 20;
  /// Loop iterations over the whole rendering.
  int64_t max_iterations = int64_t{1} << 20;
};

/// Renders parsed nodes with `globals` as the top-level variables. Semantics follow Jinja2's
/// default environment: undefined variables render as "" and are falsy, but reading an
/// attribute or item of an undefined value is an error; `set` inside a for loop stays local to
/// the loop. Errors are INVALID_ARGUMENT: "line N: ..." for evaluation errors, and
/// "raise_exception: MSG" when the template calls raise_exception(MSG).
absl::StatusOr<std::string> Render(const std::vector<Node>& nodes, const Value::Map& globals,
                                   const RenderLimits& limits = {});

}  // namespace kvserve::jinja

#endif  // KVSERVE_COMMON_CHAT_TEMPLATE_JINJA_RENDER_H_
