#include "common/chat_template/jinja_parser.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace kvserve::jinja {
namespace {

/// Nesting bound of expressions and blocks: a hostile template cannot exhaust the stack.
constexpr int kMaxDepth = 128;

const absl::flat_hash_set<std::string>& Filters() {
  static const auto* const kSet = new absl::flat_hash_set<std::string>{
      "trim",  "length", "count", "upper",   "lower", "string",
      "first", "last",   "join",  "default", "d",     "tojson"};
  return *kSet;
}

const absl::flat_hash_set<std::string>& Tests() {
  static const auto* const kSet = new absl::flat_hash_set<std::string>{
      "defined",  "undefined", "none",    "string",  "number", "mapping",
      "iterable", "sequence",  "boolean", "integer", "true",   "false"};
  return *kSet;
}

const absl::flat_hash_set<std::string>& Methods() {
  static const auto* const kSet = new absl::flat_hash_set<std::string>{
      "strip",    "lstrip", "rstrip", "upper", "lower",  "startswith",
      "endswith", "split",  "items",  "keys",  "values", "get"};
  return *kSet;
}

absl::Status Error(int line, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("line ", line, ": ", message));
}

struct Token {
  enum class Type { kText, kExprOpen, kStmtOpen, kClose, kName, kString, kInt, kFloat, kOp, kEnd };
  Type type = Type::kEnd;
  std::string text;
  int line = 1;
  int64_t int_value = 0;
  double float_value = 0;
};

bool IsNameStart(char c) { return absl::ascii_isalpha(c) || c == '_'; }
bool IsNameChar(char c) { return absl::ascii_isalnum(c) || c == '_'; }

/// Splits the source into text and tag tokens, applying the whitespace rules.
class Lexer {
 public:
  Lexer(std::string_view source, const ParseOptions& options) : src_(source), options_(options) {}

  absl::StatusOr<std::vector<Token>> Run() {
    while (pos_ < src_.size()) {
      size_t open = FindTagStart(pos_);
      std::string text(src_.substr(pos_, open - pos_));
      const size_t text_start = pos_;
      const int text_line = line_;
      CountLines(text_start, open);
      if (open == src_.size()) {
        EmitText(std::move(text), text_line);
        break;
      }
      const char kind = src_[open + 1];
      const char modifier = open + 2 < src_.size() ? src_[open + 2] : '\0';
      const bool block = kind == '%' || kind == '#';
      if (modifier == '-') {
        while (!text.empty() && absl::ascii_isspace(static_cast<unsigned char>(text.back()))) {
          text.pop_back();
        }
      } else if (block && modifier != '+' && options_.lstrip_blocks) {
        size_t keep = text.size();
        while (keep > 0 && (text[keep - 1] == ' ' || text[keep - 1] == '\t')) --keep;
        const size_t before = text_start + keep;  // source offset of the first stripped char
        if (before == 0 || src_[before - 1] == '\n') text.resize(keep);
      }
      EmitText(std::move(text), text_line);
      pos_ = open + 2 + ((modifier == '-' || modifier == '+') ? 1 : 0);
      bool strip_after = false;
      if (kind == '#') {
        const size_t close = src_.find("#}", pos_);
        if (close == std::string_view::npos) return Error(line_, "unterminated comment");
        strip_after = close > pos_ && src_[close - 1] == '-';
        CountLines(pos_, close + 2);
        pos_ = close + 2;
      } else {
        Token open_token;
        open_token.type = kind == '{' ? Token::Type::kExprOpen : Token::Type::kStmtOpen;
        open_token.line = line_;
        tokens_.push_back(open_token);
        absl::StatusOr<bool> strip = LexTag(kind == '{' ? '}' : '%');
        if (!strip.ok()) return strip.status();
        strip_after = *strip;
      }
      if (strip_after) {
        while (pos_ < src_.size() && absl::ascii_isspace(static_cast<unsigned char>(src_[pos_]))) {
          if (src_[pos_] == '\n') ++line_;
          ++pos_;
        }
      } else if (block && options_.trim_blocks && !plus_close_) {
        if (src_.substr(pos_, 1) == "\n") {
          ++pos_;
          ++line_;
        } else if (src_.substr(pos_, 2) == "\r\n") {
          pos_ += 2;
          ++line_;
        }
      }
    }
    Token end;
    end.type = Token::Type::kEnd;
    end.line = line_;
    tokens_.push_back(end);
    return std::move(tokens_);
  }

 private:
  size_t FindTagStart(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return src_.size();
  }

  void CountLines(size_t from, size_t to) {
    for (size_t i = from; i < to && i < src_.size(); ++i) line_ += src_[i] == '\n';
  }

  void EmitText(std::string text, int line) {
    if (text.empty()) return;
    Token token;
    token.type = Token::Type::kText;
    token.line = line;
    token.text = std::move(text);
    tokens_.push_back(std::move(token));
  }

  /// Lexes expression tokens up to the tag's end ("}}" or "%}"); returns whether the end had
  /// a '-' (strip the whitespace after).
  absl::StatusOr<bool> LexTag(char close_char) {
    plus_close_ = false;
    while (true) {
      while (pos_ < src_.size() && absl::ascii_isspace(static_cast<unsigned char>(src_[pos_]))) {
        if (src_[pos_] == '\n') ++line_;
        ++pos_;
      }
      if (pos_ >= src_.size()) return Error(line_, "unterminated tag");
      const std::string_view rest = src_.substr(pos_);
      const std::string close = std::string(1, close_char) + "}";
      for (const char* prefix : {"-", "+", ""}) {
        if (rest.substr(0, close.size() + std::strlen(prefix)) == std::string(prefix) + close) {
          Token token;
          token.type = Token::Type::kClose;
          token.line = line_;
          tokens_.push_back(token);
          pos_ += close.size() + std::strlen(prefix);
          plus_close_ = prefix[0] == '+';
          return prefix[0] == '-';
        }
      }
      Token token;
      token.line = line_;
      const char c = rest[0];
      if (c == '\'' || c == '"') {
        token.type = Token::Type::kString;
        size_t i = 1;
        for (; i < rest.size() && rest[i] != c; ++i) {
          if (rest[i] == '\\' && i + 1 < rest.size()) {
            ++i;
            switch (rest[i]) {
              case 'n':
                token.text += '\n';
                break;
              case 't':
                token.text += '\t';
                break;
              case 'r':
                token.text += '\r';
                break;
              default:
                token.text += rest[i];
                break;
            }
          } else {
            if (rest[i] == '\n') ++line_;
            token.text += rest[i];
          }
        }
        if (i >= rest.size()) return Error(token.line, "unterminated string literal");
        pos_ += i + 1;
      } else if (absl::ascii_isdigit(static_cast<unsigned char>(c))) {
        size_t i = 0;
        while (i < rest.size() && absl::ascii_isdigit(static_cast<unsigned char>(rest[i]))) ++i;
        const bool is_float = i + 1 < rest.size() && rest[i] == '.' &&
                              absl::ascii_isdigit(static_cast<unsigned char>(rest[i + 1]));
        if (is_float) {
          ++i;
          while (i < rest.size() && absl::ascii_isdigit(static_cast<unsigned char>(rest[i]))) ++i;
        }
        token.text = std::string(rest.substr(0, i));
        if (is_float) {
          token.type = Token::Type::kFloat;
          token.float_value = std::strtod(token.text.c_str(), nullptr);
        } else {
          token.type = Token::Type::kInt;
          if (token.text.size() > 18) return Error(line_, "integer literal too large");
          token.int_value = std::strtoll(token.text.c_str(), nullptr, 10);
        }
        pos_ += i;
      } else if (IsNameStart(c)) {
        size_t i = 1;
        while (i < rest.size() && IsNameChar(rest[i])) ++i;
        token.type = Token::Type::kName;
        token.text = std::string(rest.substr(0, i));
        pos_ += i;
      } else {
        token.type = Token::Type::kOp;
        for (const char* op : {"//", "==", "!=", "<=", ">="}) {
          if (rest.substr(0, 2) == op) token.text = op;
        }
        if (token.text.empty()) {
          if (std::string_view("+-*/%~<>()[]{},.:|=").find(c) == std::string_view::npos) {
            return Error(line_, absl::StrCat("unexpected character '", std::string(1, c), "'"));
          }
          token.text = std::string(1, c);
        }
        pos_ += token.text.size();
      }
      tokens_.push_back(std::move(token));
    }
  }

  std::string_view src_;
  const ParseOptions options_;
  size_t pos_ = 0;
  int line_ = 1;
  bool plus_close_ = false;
  std::vector<Token> tokens_;
};

/// Recursive descent over the token list (precedence as in Jinja2's parser).
class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  absl::StatusOr<std::vector<Node>> ParseTemplate() {
    std::vector<Node> nodes;
    std::string end;
    if (absl::Status s = ParseBody({}, &nodes, &end); !s.ok()) return s;
    return nodes;
  }

 private:
  using ExprPtr = std::unique_ptr<Expr>;
  using Type = Token::Type;

  const Token& Peek(size_t ahead = 0) const {
    return tokens_[std::min(index_ + ahead, tokens_.size() - 1)];
  }
  const Token& Next() { return tokens_[std::min(index_++, tokens_.size() - 1)]; }
  bool IsOp(const char* op, size_t ahead = 0) const {
    return Peek(ahead).type == Type::kOp && Peek(ahead).text == op;
  }
  bool IsName(const char* name, size_t ahead = 0) const {
    return Peek(ahead).type == Type::kName && Peek(ahead).text == name;
  }
  absl::Status Expect(Type type, const char* what) {
    if (Peek().type != type) {
      return Error(Peek().line, absl::StrCat("expected ", what, ", found ", Describe(Peek())));
    }
    ++index_;
    return absl::OkStatus();
  }
  absl::Status ExpectOp(const char* op) {
    if (!IsOp(op)) {
      return Error(Peek().line, absl::StrCat("expected '", op, "', found ", Describe(Peek())));
    }
    ++index_;
    return absl::OkStatus();
  }
  static std::string Describe(const Token& token) {
    switch (token.type) {
      case Type::kEnd:
        return "the end of the template";
      case Type::kClose:
        return "the end of the tag";
      case Type::kText:
        return "text";
      case Type::kString:
        return "a string";
      default:
        return absl::StrCat("'", token.text, "'");
    }
  }

  /// Parses nodes until a statement whose keyword is in `ends` (consumed up to the keyword;
  /// stored in *end) or the end of input (only allowed when `ends` is empty).
  absl::Status ParseBody(const std::vector<std::string>& ends, std::vector<Node>* nodes,
                         std::string* end) {
    if (++depth_ > kMaxDepth) return Error(Peek().line, "blocks nested too deeply");
    while (true) {
      const Token& token = Peek();
      if (token.type == Type::kEnd) {
        if (ends.empty()) break;
        return Error(token.line, absl::StrCat("missing {% ", ends.back(), " %}"));
      }
      if (token.type == Type::kText) {
        Node node;
        node.kind = Node::Kind::kText;
        node.line = token.line;
        node.text = token.text;
        nodes->push_back(std::move(node));
        ++index_;
        continue;
      }
      if (token.type == Type::kExprOpen) {
        ++index_;
        Node node;
        node.kind = Node::Kind::kOutput;
        node.line = token.line;
        absl::StatusOr<ExprPtr> expr = ParseExpression(true);
        if (!expr.ok()) return expr.status();
        node.expr = *std::move(expr);
        if (absl::Status s = Expect(Type::kClose, "'}}'"); !s.ok()) return s;
        nodes->push_back(std::move(node));
        continue;
      }
      if (token.type != Type::kStmtOpen) return Error(token.line, "unexpected token");
      const Token& keyword = Peek(1);
      if (keyword.type != Type::kName) return Error(keyword.line, "expected a statement name");
      for (const std::string& e : ends) {
        if (keyword.text == e) {
          index_ += 2;
          *end = e;
          --depth_;
          return absl::OkStatus();
        }
      }
      index_ += 2;
      absl::Status status;
      if (keyword.text == "for") {
        status = ParseFor(keyword.line, nodes);
      } else if (keyword.text == "if") {
        status = ParseIf(keyword.line, nodes);
      } else if (keyword.text == "set") {
        status = ParseSet(keyword.line, nodes);
      } else if (keyword.text == "endfor" || keyword.text == "endif" || keyword.text == "else" ||
                 keyword.text == "elif") {
        status = Error(keyword.line, absl::StrCat("unexpected {% ", keyword.text, " %}"));
      } else {
        status = Error(keyword.line, absl::StrCat("unsupported statement '", keyword.text, "'"));
      }
      if (!status.ok()) return status;
    }
    --depth_;
    return absl::OkStatus();
  }

  absl::Status ParseFor(int line, std::vector<Node>* nodes) {
    Node node;
    node.kind = Node::Kind::kFor;
    node.line = line;
    while (true) {
      if (Peek().type != Type::kName) return Error(Peek().line, "expected a loop variable name");
      node.targets.push_back(Next().text);
      if (!IsOp(",")) break;
      ++index_;
    }
    if (node.targets.size() > 2) return Error(line, "at most two loop variables are supported");
    if (!IsName("in")) return Error(Peek().line, "expected 'in' in the for statement");
    ++index_;
    absl::StatusOr<ExprPtr> iterable = ParseExpression(false);
    if (!iterable.ok()) return iterable.status();
    node.expr = *std::move(iterable);
    if (IsName("if")) {
      ++index_;
      absl::StatusOr<ExprPtr> filter = ParseExpression(false);
      if (!filter.ok()) return filter.status();
      node.filter = *std::move(filter);
    }
    if (IsName("recursive")) return Error(Peek().line, "unsupported: recursive loops");
    if (absl::Status s = Expect(Type::kClose, "'%}'"); !s.ok()) return s;
    std::string end;
    if (absl::Status s = ParseBody({"else", "endfor"}, &node.body, &end); !s.ok()) return s;
    if (absl::Status s = Expect(Type::kClose, "'%}'"); !s.ok()) return s;
    if (end == "else") {
      if (absl::Status s = ParseBody({"endfor"}, &node.else_body, &end); !s.ok()) return s;
      if (absl::Status s = Expect(Type::kClose, "'%}'"); !s.ok()) return s;
    }
    nodes->push_back(std::move(node));
    return absl::OkStatus();
  }

  absl::Status ParseIf(int line, std::vector<Node>* nodes) {
    Node node;
    node.kind = Node::Kind::kIf;
    node.line = line;
    std::string end = "if";
    while (end != "endif") {
      Node::Branch branch;
      if (end != "else") {
        absl::StatusOr<ExprPtr> condition = ParseExpression(true);
        if (!condition.ok()) return condition.status();
        branch.condition = *std::move(condition);
      }
      if (absl::Status s = Expect(Type::kClose, "'%}'"); !s.ok()) return s;
      const std::vector<std::string> ends = end == "else"
                                                ? std::vector<std::string>{"endif"}
                                                : std::vector<std::string>{"elif", "else", "endif"};
      if (absl::Status s = ParseBody(ends, &branch.body, &end); !s.ok()) return s;
      node.branches.push_back(std::move(branch));
    }
    if (absl::Status s = Expect(Type::kClose, "'%}'"); !s.ok()) return s;
    nodes->push_back(std::move(node));
    return absl::OkStatus();
  }

  absl::Status ParseSet(int line, std::vector<Node>* nodes) {
    Node node;
    node.kind = Node::Kind::kSet;
    node.line = line;
    if (Peek().type != Type::kName) return Error(Peek().line, "expected a variable name");
    node.targets.push_back(Next().text);
    if (IsOp(".")) {  // a namespace's attribute
      ++index_;
      if (Peek().type != Type::kName) return Error(Peek().line, "expected an attribute name");
      node.attribute = Next().text;
    }
    if (IsOp(",")) return Error(line, "unsupported: assigning to several names");
    if (!IsOp("=")) return Error(line, "unsupported: {% set %} blocks (expected '=')");
    ++index_;
    absl::StatusOr<ExprPtr> value = ParseExpression(true);
    if (!value.ok()) return value.status();
    node.expr = *std::move(value);
    if (absl::Status s = Expect(Type::kClose, "'%}'"); !s.ok()) return s;
    nodes->push_back(std::move(node));
    return absl::OkStatus();
  }

  ExprPtr MakeExpr(Expr::Kind kind, int line, std::string name = "") {
    auto expr = std::make_unique<Expr>();
    expr->kind = kind;
    expr->line = line;
    expr->name = std::move(name);
    return expr;
  }

  ExprPtr Combine(Expr::Kind kind, int line, std::string name, ExprPtr a, ExprPtr b) {
    ExprPtr expr = MakeExpr(kind, line, std::move(name));
    expr->args.push_back(std::move(a));
    expr->args.push_back(std::move(b));
    return expr;
  }

  absl::StatusOr<ExprPtr> ParseExpression(bool allow_conditional) {
    if (++depth_ > kMaxDepth) return Error(Peek().line, "expression nested too deeply");
    absl::StatusOr<ExprPtr> expr = ParseOr();
    if (expr.ok() && allow_conditional && IsName("if")) {
      const int line = Next().line;
      absl::StatusOr<ExprPtr> condition = ParseOr();
      if (!condition.ok()) return condition.status();
      ExprPtr node = MakeExpr(Expr::Kind::kConditional, line);
      node->args.push_back(*std::move(expr));
      node->args.push_back(*std::move(condition));
      if (IsName("else")) {
        ++index_;
        absl::StatusOr<ExprPtr> otherwise = ParseExpression(true);
        if (!otherwise.ok()) return otherwise.status();
        node->args.push_back(*std::move(otherwise));
      } else {
        node->args.push_back(nullptr);
      }
      expr = std::move(node);
    }
    --depth_;
    return expr;
  }

  absl::StatusOr<ExprPtr> ParseOr() {
    absl::StatusOr<ExprPtr> left = ParseAnd();
    while (left.ok() && IsName("or")) {
      const int line = Next().line;
      absl::StatusOr<ExprPtr> right = ParseAnd();
      if (!right.ok()) return right.status();
      left = Combine(Expr::Kind::kOr, line, "or", *std::move(left), *std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseAnd() {
    absl::StatusOr<ExprPtr> left = ParseNot();
    while (left.ok() && IsName("and")) {
      const int line = Next().line;
      absl::StatusOr<ExprPtr> right = ParseNot();
      if (!right.ok()) return right.status();
      left = Combine(Expr::Kind::kAnd, line, "and", *std::move(left), *std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseNot() {
    if (IsName("not")) {
      if (++depth_ > kMaxDepth) return Error(Peek().line, "expression nested too deeply");
      const int line = Next().line;
      absl::StatusOr<ExprPtr> operand = ParseNot();
      --depth_;
      if (!operand.ok()) return operand.status();
      ExprPtr node = MakeExpr(Expr::Kind::kNot, line);
      node->args.push_back(*std::move(operand));
      return node;
    }
    return ParseCompare();
  }

  absl::StatusOr<ExprPtr> ParseCompare() {
    absl::StatusOr<ExprPtr> left = ParseMath1();
    while (left.ok()) {
      std::string op;
      if (Peek().type == Type::kOp &&
          (Peek().text == "==" || Peek().text == "!=" || Peek().text == "<" ||
           Peek().text == "<=" || Peek().text == ">" || Peek().text == ">=")) {
        op = Peek().text;
        ++index_;
      } else if (IsName("in")) {
        op = "in";
        ++index_;
      } else if (IsName("not") && IsName("in", 1)) {
        op = "not in";
        index_ += 2;
      } else {
        break;
      }
      const int line = Peek().line;
      absl::StatusOr<ExprPtr> right = ParseMath1();
      if (!right.ok()) return right.status();
      left = Combine(Expr::Kind::kCompare, line, op, *std::move(left), *std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseMath1() {
    absl::StatusOr<ExprPtr> left = ParseConcat();
    while (left.ok() && (IsOp("+") || IsOp("-"))) {
      const Token& op = Next();
      absl::StatusOr<ExprPtr> right = ParseConcat();
      if (!right.ok()) return right.status();
      left = Combine(Expr::Kind::kBinary, op.line, op.text, *std::move(left), *std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseConcat() {
    absl::StatusOr<ExprPtr> left = ParseMath2();
    while (left.ok() && IsOp("~")) {
      const Token& op = Next();
      absl::StatusOr<ExprPtr> right = ParseMath2();
      if (!right.ok()) return right.status();
      left = Combine(Expr::Kind::kBinary, op.line, "~", *std::move(left), *std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseMath2() {
    absl::StatusOr<ExprPtr> left = ParseUnary();
    while (left.ok() && (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%"))) {
      const Token& op = Next();
      absl::StatusOr<ExprPtr> right = ParseUnary();
      if (!right.ok()) return right.status();
      left = Combine(Expr::Kind::kBinary, op.line, op.text, *std::move(left), *std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseUnary() {
    if (IsOp("-") || IsOp("+")) {
      if (++depth_ > kMaxDepth) return Error(Peek().line, "expression nested too deeply");
      const Token& op = Next();
      absl::StatusOr<ExprPtr> operand = ParseUnary();
      --depth_;
      if (!operand.ok() || op.text == "+") return operand;
      ExprPtr node = MakeExpr(Expr::Kind::kNegate, op.line);
      node->args.push_back(*std::move(operand));
      return node;
    }
    absl::StatusOr<ExprPtr> expr = ParsePrimary();
    if (!expr.ok()) return expr;
    absl::Status status = ParsePostfix(&*expr);
    if (status.ok()) status = ParseFiltersAndTests(&*expr);
    if (!status.ok()) return status;
    return expr;
  }

  absl::Status ParseArgs(Expr* call) {
    // After '(' : expr (',' expr)* ')'
    while (!IsOp(")")) {
      std::string keyword;
      if (Peek().type == Type::kName && IsOp("=", 1)) {
        keyword = Next().text;
        ++index_;
      } else if (!call->keywords.empty()) {
        return Error(Peek().line, "positional argument follows keyword argument");
      }
      absl::StatusOr<ExprPtr> arg = ParseExpression(true);
      if (!arg.ok()) return arg.status();
      call->args.push_back(*std::move(arg));
      if (!keyword.empty() || !call->keywords.empty()) {
        call->keywords.resize(call->args.size());
        call->keywords.back() = std::move(keyword);
      }
      if (!IsOp(",")) break;
      ++index_;
    }
    return ExpectOp(")");
  }

  absl::Status ParsePostfix(ExprPtr* expr) {
    while (true) {
      if (IsOp(".")) {
        const int line = Next().line;
        if (Peek().type != Type::kName) return Error(line, "expected an attribute name after '.'");
        std::string name = Next().text;
        if (IsOp("(")) {
          ++index_;
          if (!Methods().contains(name)) {
            return Error(line, absl::StrCat("unsupported method '", name, "'"));
          }
          ExprPtr call = MakeExpr(Expr::Kind::kMethod, line, name);
          call->args.push_back(std::move(*expr));
          if (absl::Status s = ParseArgs(call.get()); !s.ok()) return s;
          *expr = std::move(call);
        } else {
          ExprPtr attr = MakeExpr(Expr::Kind::kAttr, line, name);
          attr->args.push_back(std::move(*expr));
          *expr = std::move(attr);
        }
      } else if (IsOp("[")) {
        const int line = Next().line;
        ExprPtr parts[3];
        bool slice = false;
        for (int part = 0; part < 3; ++part) {
          if (!IsOp(":") && !IsOp("]")) {
            absl::StatusOr<ExprPtr> e = ParseExpression(true);
            if (!e.ok()) return e.status();
            parts[part] = *std::move(e);
          }
          if (!IsOp(":")) break;
          ++index_;
          slice = true;
        }
        if (absl::Status s = ExpectOp("]"); !s.ok()) return s;
        ExprPtr node = MakeExpr(slice ? Expr::Kind::kSlice : Expr::Kind::kItem, line);
        node->args.push_back(std::move(*expr));
        if (!slice && parts[0] == nullptr) return Error(line, "empty subscript");
        node->args.push_back(std::move(parts[0]));
        if (slice) {
          node->args.push_back(std::move(parts[1]));
          node->args.push_back(std::move(parts[2]));
        }
        *expr = std::move(node);
      } else if (IsOp("(")) {
        return Error(Peek().line, "unsupported: calling this expression");
      } else {
        return absl::OkStatus();
      }
    }
  }

  absl::Status ParseFiltersAndTests(ExprPtr* expr) {
    while (true) {
      if (IsOp("|")) {
        const int line = Next().line;
        if (Peek().type != Type::kName) return Error(line, "expected a filter name after '|'");
        std::string name = Next().text;
        if (!Filters().contains(name)) {
          return Error(line, absl::StrCat("unsupported filter '", name, "'"));
        }
        ExprPtr node = MakeExpr(Expr::Kind::kFilter, line, name);
        node->args.push_back(std::move(*expr));
        if (IsOp("(")) {
          ++index_;
          if (absl::Status s = ParseArgs(node.get()); !s.ok()) return s;
        }
        *expr = std::move(node);
      } else if (IsName("is")) {
        const int line = Next().line;
        ExprPtr node = MakeExpr(Expr::Kind::kTest, line);
        if (IsName("not")) {
          ++index_;
          node->negated = true;
        }
        if (Peek().type != Type::kName) return Error(line, "expected a test name after 'is'");
        node->name = Next().text;
        if (!Tests().contains(node->name)) {
          return Error(line, absl::StrCat("unsupported test '", node->name, "'"));
        }
        node->args.push_back(std::move(*expr));
        *expr = std::move(node);
      } else {
        return absl::OkStatus();
      }
    }
  }

  absl::StatusOr<ExprPtr> ParsePrimary() {
    const Token& token = Peek();
    const int line = token.line;
    switch (token.type) {
      case Type::kString: {
        ExprPtr node = MakeExpr(Expr::Kind::kLiteral, line);
        std::string text;
        while (Peek().type == Type::kString) text += Next().text;  // 'a' 'b' → 'ab'
        node->literal = Value::String(std::move(text));
        return node;
      }
      case Type::kInt: {
        ExprPtr node = MakeExpr(Expr::Kind::kLiteral, line);
        node->literal = Value::Int(Next().int_value);
        return node;
      }
      case Type::kFloat: {
        ExprPtr node = MakeExpr(Expr::Kind::kLiteral, line);
        node->literal = Value::Float(Next().float_value);
        return node;
      }
      case Type::kName: {
        const std::string name = Next().text;
        ExprPtr node = MakeExpr(Expr::Kind::kLiteral, line);
        if (name == "true" || name == "True") {
          node->literal = Value::Bool(true);
        } else if (name == "false" || name == "False") {
          node->literal = Value::Bool(false);
        } else if (name == "none" || name == "None") {
          node->literal = Value::None();
        } else if (IsOp("(")) {
          if (name != "raise_exception" && name != "namespace" && name != "strftime_now") {
            return Error(line, absl::StrCat("unsupported function '", name, "'"));
          }
          ++index_;
          node = MakeExpr(Expr::Kind::kCall, line, name);
          if (absl::Status s = ParseArgs(node.get()); !s.ok()) return s;
        } else {
          node = MakeExpr(Expr::Kind::kName, line, name);
        }
        return node;
      }
      case Type::kOp:
        if (token.text == "(") {
          ++index_;
          absl::StatusOr<ExprPtr> inner = ParseExpression(true);
          if (!inner.ok()) return inner;
          if (IsOp(",")) return Error(line, "unsupported: tuples");
          if (absl::Status s = ExpectOp(")"); !s.ok()) return s;
          return inner;
        }
        if (token.text == "[" || token.text == "{") {
          const bool dict = token.text == "{";
          ++index_;
          ExprPtr node = MakeExpr(dict ? Expr::Kind::kDict : Expr::Kind::kList, line);
          const char* close = dict ? "}" : "]";
          while (!IsOp(close)) {
            absl::StatusOr<ExprPtr> item = ParseExpression(true);
            if (!item.ok()) return item;
            node->args.push_back(*std::move(item));
            if (dict) {
              if (absl::Status s = ExpectOp(":"); !s.ok()) return s;
              absl::StatusOr<ExprPtr> value = ParseExpression(true);
              if (!value.ok()) return value;
              node->args.push_back(*std::move(value));
            }
            if (!IsOp(",")) break;
            ++index_;
          }
          if (absl::Status s = ExpectOp(close); !s.ok()) return s;
          return node;
        }
        break;
      default:
        break;
    }
    return Error(line, absl::StrCat("unexpected ", Describe(token), " in an expression"));
  }

  std::vector<Token> tokens_;
  size_t index_ = 0;
  int depth_ = 0;
};

}  // namespace

absl::StatusOr<std::vector<Node>> Parse(std::string_view source, const ParseOptions& options) {
  absl::StatusOr<std::vector<Token>> tokens = Lexer(source, options).Run();
  if (!tokens.ok()) return tokens.status();
  return Parser(*std::move(tokens)).ParseTemplate();
}

}  // namespace kvserve::jinja
