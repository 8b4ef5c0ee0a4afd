#ifndef KVSERVE_COMMON_CHAT_TEMPLATE_JINJA_RENDER_H_
#define KVSERVE_COMMON_CHAT_TEMPLATE_JINJA_RENDER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/civil_time.h"
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

/// What a rendering may see besides its variables.
struct RenderEnv {
  /// The date strftime_now() formats (at midnight, as Hugging Face's renderer is given a fixed
  /// date in tests); ChatTemplate passes today's (UTC) unless told otherwise.
  absl::CivilDay today = absl::CivilDay(1970, 1, 1);
  RenderLimits limits;
};

/// Renders parsed nodes with `globals` as the top-level variables. Semantics follow Jinja2's
/// default environment: undefined variables render as "" and are falsy, but reading an
/// attribute or item of an undefined value is an error; `set` inside a for loop stays local to
/// the loop (a namespace's attributes are the way out, as in Jinja2). Globals: raise_exception,
/// namespace, strftime_now; the tojson filter is Hugging Face's (json.dumps with
/// ensure_ascii=False, indent, sort_keys). Errors are INVALID_ARGUMENT: "line N: ..." for
/// evaluation errors (Python's wording for a type error such as adding a dict to a string), and
/// "raise_exception: MSG" when the template calls raise_exception(MSG).
absl::StatusOr<std::string> Render(const std::vector<Node>& nodes, const Value::Map& globals,
                                   const RenderEnv& env = {});

}  // namespace kvserve::jinja

#endif  // KVSERVE_COMMON_CHAT_TEMPLATE_JINJA_RENDER_H_
