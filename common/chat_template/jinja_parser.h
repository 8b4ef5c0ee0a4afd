#ifndef KVSERVE_COMMON_CHAT_TEMPLATE_JINJA_PARSER_H_
#define KVSERVE_COMMON_CHAT_TEMPLATE_JINJA_PARSER_H_

#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chat_template/jinja_ast.h"

namespace kvserve::jinja {

/// Whitespace handling, as Jinja2's Environment options.
struct ParseOptions {
  /// Drop the first newline after a block tag ({% %} or {# #}).
  bool trim_blocks = true;
  /// Drop spaces and tabs between the start of a line and a block tag.
  bool lstrip_blocks = true;
};

/// Parses the Jinja subset chat templates use into a node list:
///   text, {{ expr }}, {# comment #}, {% for %}/{% else %}/{% endfor %}, {% if %}/{% elif %}/
///   {% else %}/{% endif %}, {% set name = expr %}, {% set namespace.attr = expr %}, whitespace
///   control with '-' and '+'.
/// Expressions: literals (strings, numbers, true/false/none, lists, dicts), names, .attr,
/// [item], [a:b:c] slices, + - * / // % ~, comparisons, in / not in, and / or / not,
/// `x if c else y`, filters (trim, length, count, upper, lower, string, first, last, join,
/// default, tojson), tests (defined, undefined, none, string, number, mapping, iterable,
/// sequence, boolean, integer, true, false), the functions raise_exception(...),
/// namespace(name=value, ...) and strftime_now(format), keyword arguments (name=value), and the
/// methods strip, lstrip, rstrip, upper, lower, startswith, endswith, split, items, keys, values,
/// get.
/// Anything else (macros, blocks, other filters or functions) is INVALID_ARGUMENT naming the
/// line and the construct, so an unsupported template fails at load rather than per request.
absl::StatusOr<std::vector<Node>> Parse(std::string_view source, const ParseOptions& options);

}  // namespace kvserve::jinja

#endif  // KVSERVE_COMMON_CHAT_TEMPLATE_JINJA_PARSER_H_
