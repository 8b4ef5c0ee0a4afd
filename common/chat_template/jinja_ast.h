#ifndef KVSERVE_COMMON_CHAT_TEMPLATE_JINJA_AST_H_
#define KVSERVE_COMMON_CHAT_TEMPLATE_JINJA_AST_H_

#include <memory>
#include <string>
#include <vector>

#include "common/chat_template/jinja_value.h"

namespace kvserve::jinja {

/// An expression node. Which fields are used depends on the kind (noted per kind).
struct Expr {
  enum class Kind {
    kLiteral,      // literal
    kName,         // name
    kList,         // args: the items
    kDict,         // args: key0, value0, key1, value1, ...
    kAttr,         // args[0].name
    kItem,         // args[0][args[1]]
    kSlice,        // args[0][args[1]:args[2]:args[3]]; absent bounds are null
    kNot,          // not args[0]
    kNegate,       // -args[0]
    kBinary,       // args[0] <name> args[1]; name is one of + - * / // % ~
    kCompare,      // args[0] <name> args[1]; name is one of == != < <= > >= in "not in"
    kAnd,          // args[0] and args[1]
    kOr,           // args[0] or args[1]
    kConditional,  // args[0] if args[1] else args[2] (args[2] may be null)
    kFilter,       // args[0] | name(args[1..])
    kTest,         // args[0] is [not] name; negated
    kCall,         // name(args...): a global function (raise_exception, namespace, strftime_now)
    kMethod,       // args[0].name(args[1..])
  };
  Kind kind = Kind::kLiteral;
  /// Source line (1-based) for error messages.
  int line = 1;
  std::string name;
  Value literal;
  bool negated = false;
  std::vector<std::unique_ptr<Expr>> args;
  /// For calls, filters and methods: the keyword naming each of args ("" for positional ones and
  /// for the filtered value or method receiver in args[0]); empty when no argument has one.
  std::vector<std::string> keywords;
};

/// A template node.
struct Node {
  enum class Kind {
    kText,    // text
    kOutput,  // {{ expr }}
    kIf,      // branches (a null condition is the else branch)
    kFor,     // {% for targets in expr [if filter] %} body [{% else %} else_body] {% endfor %}
    kSet,     // {% set targets[0] = expr %}, or {% set targets[0].attribute = expr %}
  };
  struct Branch {
    std::unique_ptr<Expr> condition;
    std::vector<Node> body;
  };
  Kind kind = Kind::kText;
  int line = 1;
  std::string text;
  std::unique_ptr<Expr> expr;
  std::vector<std::string> targets;
  /// kSet of a namespace's attribute: its name.
  std::string attribute;
  std::unique_ptr<Expr> filter;
  std::vector<Branch> branches;
  std::vector<Node> body;
  std::vector<Node> else_body;
};

}  // namespace kvserve::jinja

#endif  // KVSERVE_COMMON_CHAT_TEMPLATE_JINJA_AST_H_
