#include "jinja/parser.h"

#include <set>
#include <stdexcept>

#include "jinja/builtins.h"
#include "jinja/limits.h"

namespace engine::jinja {
namespace {

// Thrown inside the parser only; Parse turns it into a Status.
struct ParseError {
  int line;
  int column;
  std::string message;
};

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : tokens_(tokens) {}

  Body ParseTemplate() {
    Body body = ParseBody({});
    if (!AtEnd()) {
      // ParseBody stops only at the end or at an end tag that no open block expects.
      const Token& name = tokens_[pos_ + 1];
      Fail(name, "unexpected '" + name.value + "': no open block to close");
    }
    return body;
  }

 private:
  using Kind = Token::Kind;

  const Token& Peek(size_t ahead = 0) const {
    size_t i = pos_ + ahead;
    return i < tokens_.size() ? tokens_[i] : tokens_.back();
  }
  const Token& Next() {
    const Token& token = Peek();
    if (pos_ < tokens_.size() - 1) ++pos_;
    return token;
  }
  bool AtEnd() const { return Peek().kind == Kind::kEnd; }
  bool IsOp(const char* op, size_t ahead = 0) const {
    return Peek(ahead).kind == Kind::kOperator && Peek(ahead).value == op;
  }
  bool IsName(const char* name, size_t ahead = 0) const {
    return Peek(ahead).kind == Kind::kName && Peek(ahead).value == name;
  }
  // An int or float token's value; one past 64 bits (or a double's range) is an error.
  Value NumberLiteral(const Token& token) const {
    try {
      return token.kind == Kind::kInt ? Value::Int(std::stoll(token.value))
                                      : Value::Float(std::stod(token.value));
    } catch (const std::out_of_range&) {
      Fail(token, "number " + token.value + " is out of range");
    }
  }

  [[noreturn]] void Fail(const Token& at, const std::string& message) const {
    throw ParseError{at.line, at.column, message};
  }
  // Entered by every rule that can recur into itself: nesting past kMaxNesting is an error at the
  // token where it happens, not a stack overflow.
  class Nested {
   public:
    explicit Nested(Parser& parser) : parser_(parser) {
      if (++parser_.depth_ > kMaxNesting) {
        parser_.Fail(parser_.Peek(), "blocks or expressions nested deeper than " +
                                         std::to_string(kMaxNesting) + " levels");
      }
    }
    ~Nested() { --parser_.depth_; }
    Nested(const Nested&) = delete;
    Nested& operator=(const Nested&) = delete;

   private:
    Parser& parser_;
  };
  // A rule that builds a left-deep tree in a loop (a + b + c ..., x.a.b, y | f | g): each link
  // is one level more for the evaluator and for the tree's destructor, so it counts too.
  class Chain {
   public:
    explicit Chain(Parser& parser) : parser_(parser) {}
    ~Chain() { parser_.depth_ -= links_; }
    Chain(const Chain&) = delete;
    Chain& operator=(const Chain&) = delete;
    void Link() {
      ++links_;
      if (++parser_.depth_ > kMaxNesting) {
        parser_.Fail(parser_.Peek(), "blocks or expressions nested deeper than " +
                                         std::to_string(kMaxNesting) + " levels");
      }
    }

   private:
    Parser& parser_;
    int links_ = 0;
  };
  void ExpectOp(const char* op) {
    if (!IsOp(op)) Fail(Peek(), std::string("expected '") + op + "', got " + DescribeToken(Peek()));
    Next();
  }
  void ExpectBlockEnd() {
    if (Peek().kind != Kind::kBlockEnd) {
      Fail(Peek(), "expected '%}', got " + DescribeToken(Peek()));
    }
    Next();
  }
  std::string ExpectName() {
    if (Peek().kind != Kind::kName) Fail(Peek(), "expected a name, got " + DescribeToken(Peek()));
    return Next().value;
  }
  ExprPtr Make(Expr::Kind kind, const Token& at) {
    auto expr = std::make_unique<Expr>();
    expr->kind = kind;
    expr->line = at.line;
    expr->column = at.column;
    return expr;
  }

  // --- Statements ---------------------------------------------------------------------------

  // Parses until the end of the template or a `{% name %}` with name in `ends` (not consumed).
  Body ParseBody(const std::set<std::string>& ends) {
    Nested nested(*this);
    Body body;
    while (!AtEnd()) {
      const Token& token = Peek();
      if (token.kind == Kind::kText) {
        auto node = MakeNode(Node::Kind::kText, token);
        node->text = Next().value;
        body.push_back(std::move(node));
      } else if (token.kind == Kind::kVariableBegin) {
        Next();
        auto node = MakeNode(Node::Kind::kOutput, token);
        node->expr = ParseTuple(true, false);
        if (Peek().kind != Kind::kVariableEnd) {
          Fail(Peek(), "expected '}}', got " + DescribeToken(Peek()));
        }
        Next();
        body.push_back(std::move(node));
      } else if (token.kind == Kind::kBlockBegin) {
        const Token& name = Peek(1);
        if (name.kind == Kind::kName && IsEndTag(name.value)) {
          if (ends.count(name.value)) return body;
          if (ends.empty()) return body;  // ParseTemplate reports it
          Fail(name, "unexpected '" + name.value + "', expected " + Expected(ends));
        }
        Next();
        body.push_back(ParseStatement());
      } else {
        Fail(token, "unexpected " + DescribeToken(token));
      }
    }
    if (!ends.empty()) {
      Fail(Peek(), "unexpected end of template, expected " + Expected(ends));
    }
    return body;
  }

  static bool IsEndTag(const std::string& name) {
    static const std::set<std::string> kEnds = {"endif",   "elif",      "else",
                                                "endfor",  "endset",    "endmacro",
                                                "endcall", "endfilter", "endgeneration"};
    return kEnds.count(name) > 0;
  }
  static std::string Expected(const std::set<std::string>& ends) {
    std::string out;
    for (const auto& end : ends) out += (out.empty() ? "'" : " or '") + end + "'";
    return out;
  }
  // Consumes `{% name` and returns the name's token.
  const Token& TakeTag() {
    Next();
    return Next();
  }

  std::unique_ptr<Node> MakeNode(Node::Kind kind, const Token& at) {
    auto node = std::make_unique<Node>();
    node->kind = kind;
    node->line = at.line;
    node->column = at.column;
    return node;
  }

  std::unique_ptr<Node> ParseStatement() {
    const Token& name = Peek();
    if (name.kind != Kind::kName) Fail(name, "expected a tag name, got " + DescribeToken(name));
    const std::string& tag = name.value;
    if (tag == "if") return ParseIf();
    if (tag == "for") return ParseFor();
    if (tag == "set") return ParseSet();
    if (tag == "macro") return ParseMacro();
    if (tag == "call") return ParseCallBlock();
    if (tag == "filter") return ParseFilterBlock();
    if (tag == "generation") return ParseGeneration();
    if (tag == "break" || tag == "continue") {
      Next();
      if (loop_depth_ == 0) Fail(name, "'" + tag + "' outside a for loop");
      ExpectBlockEnd();
      return MakeNode(tag == "break" ? Node::Kind::kBreak : Node::Kind::kContinue, name);
    }
    static const std::set<std::string> kUnsupported = {
        "extends", "include", "import", "from", "block", "with", "do", "autoescape", "trans"};
    if (kUnsupported.count(tag)) {
      Fail(name, "the '" + tag + "' tag is not supported in chat templates");
    }
    Fail(name, "unknown tag '" + tag + "'");
  }

  std::unique_ptr<Node> ParseIf() {
    auto node = MakeNode(Node::Kind::kIf, Next());
    ExprPtr test = ParseTuple(false, false);
    ExpectBlockEnd();
    while (true) {
      Body body = ParseBody({"elif", "else", "endif"});
      node->branches.emplace_back(std::move(test), std::move(body));
      const Token& tag = TakeTag();
      if (tag.value == "elif") {
        test = ParseTuple(false, false);
        ExpectBlockEnd();
        continue;
      }
      if (tag.value == "else") {
        ExpectBlockEnd();
        node->branches.emplace_back(nullptr, ParseBody({"endif"}));
        TakeTag();
      }
      ExpectBlockEnd();
      return node;
    }
  }

  ExprPtr ParseAssignTarget(bool allow_namespace_attribute) {
    const Token& first = Peek();
    std::vector<ExprPtr> names;
    while (true) {
      const Token& token = Peek();
      std::string name = ExpectName();
      if (allow_namespace_attribute && IsOp(".")) {
        Next();
        auto attr = Make(Expr::Kind::kGetAttr, token);
        attr->a = Make(Expr::Kind::kName, token);
        attr->a->name = name;
        attr->name = ExpectName();
        return attr;
      }
      auto expr = Make(Expr::Kind::kName, token);
      expr->name = name;
      names.push_back(std::move(expr));
      if (!IsOp(",")) break;
      Next();
    }
    if (names.size() == 1) return std::move(names[0]);
    auto tuple = Make(Expr::Kind::kTuple, first);
    tuple->items = std::move(names);
    return tuple;
  }

  std::unique_ptr<Node> ParseFor() {
    auto node = MakeNode(Node::Kind::kFor, Next());
    node->target = ParseAssignTarget(false);
    if (!IsName("in")) Fail(Peek(), "expected 'in', got " + DescribeToken(Peek()));
    Next();
    node->expr = ParseTuple(false, false);
    if (IsName("if")) {
      Next();
      node->condition = ParseExpression(true);
    }
    if (IsName("recursive")) Fail(Peek(), "recursive for loops are not supported");
    ExpectBlockEnd();
    ++loop_depth_;
    node->body = ParseBody({"endfor", "else"});
    --loop_depth_;
    if (TakeTag().value == "else") {
      ExpectBlockEnd();
      node->else_body = ParseBody({"endfor"});
      TakeTag();
    }
    ExpectBlockEnd();
    return node;
  }

  std::unique_ptr<Node> ParseSet() {
    const Token& start = Next();
    ExprPtr target = ParseAssignTarget(true);
    if (IsOp("=")) {
      Next();
      auto node = MakeNode(Node::Kind::kSet, start);
      node->target = std::move(target);
      node->expr = ParseTuple(true, false);
      ExpectBlockEnd();
      return node;
    }
    auto node = MakeNode(Node::Kind::kSetBlock, start);
    node->target = std::move(target);
    while (IsOp("|")) {
      Next();
      node->filters.push_back(ParseFilter(nullptr));
    }
    ExpectBlockEnd();
    node->body = ParseBody({"endset"});
    TakeTag();
    ExpectBlockEnd();
    return node;
  }

  KeywordArgs ParseParameters() {
    KeywordArgs params;
    ExpectOp("(");
    while (!IsOp(")")) {
      if (!params.empty()) ExpectOp(",");
      if (IsOp(")")) break;
      const Token& at = Peek();
      std::string name = ExpectName();
      ExprPtr default_value;
      if (IsOp("=")) {
        Next();
        default_value = ParseExpression(true);
      } else if (!params.empty() && params.back().second != nullptr) {
        Fail(at, "parameter '" + name + "' without a default follows one with a default");
      }
      params.emplace_back(name, std::move(default_value));
    }
    Next();
    return params;
  }

  std::unique_ptr<Node> ParseMacro() {
    auto node = MakeNode(Node::Kind::kMacro, Next());
    node->name = ExpectName();
    node->params = ParseParameters();
    ExpectBlockEnd();
    int saved = loop_depth_;
    loop_depth_ = 0;
    node->body = ParseBody({"endmacro"});
    loop_depth_ = saved;
    TakeTag();
    ExpectBlockEnd();
    return node;
  }

  std::unique_ptr<Node> ParseCallBlock() {
    auto node = MakeNode(Node::Kind::kCallBlock, Next());
    if (IsOp("(")) node->params = ParseParameters();
    node->expr = ParseExpression(true);
    if (node->expr->kind != Expr::Kind::kCall) Fail(Peek(), "expected a call after 'call'");
    ExpectBlockEnd();
    node->body = ParseBody({"endcall"});
    TakeTag();
    ExpectBlockEnd();
    return node;
  }

  std::unique_ptr<Node> ParseFilterBlock() {
    auto node = MakeNode(Node::Kind::kFilterBlock, Next());
    node->filters.push_back(ParseFilter(nullptr));
    while (IsOp("|")) {
      Next();
      node->filters.push_back(ParseFilter(nullptr));
    }
    ExpectBlockEnd();
    node->body = ParseBody({"endfilter"});
    TakeTag();
    ExpectBlockEnd();
    return node;
  }

  std::unique_ptr<Node> ParseGeneration() {
    auto node = MakeNode(Node::Kind::kGeneration, Next());
    ExpectBlockEnd();
    node->body = ParseBody({"endgeneration"});
    TakeTag();
    ExpectBlockEnd();
    return node;
  }

  // --- Expressions --------------------------------------------------------------------------

  // Expressions separated by commas: a tuple when there is a comma (or `()`), else the one.
  ExprPtr ParseTuple(bool with_condition, bool explicit_parentheses) {
    const Token& start = Peek();
    std::vector<ExprPtr> items;
    bool comma = false;
    while (true) {
      if (!items.empty()) {
        if (!IsOp(",")) break;
        Next();
        comma = true;
      }
      if (IsTupleEnd()) break;
      items.push_back(ParseExpression(with_condition));
    }
    if (!comma && items.size() == 1) return std::move(items[0]);
    if (items.empty() && !explicit_parentheses) {
      Fail(Peek(), "expected an expression, got " + DescribeToken(Peek()));
    }
    auto tuple = Make(Expr::Kind::kTuple, start);
    tuple->items = std::move(items);
    return tuple;
  }
  bool IsTupleEnd() const {
    Kind kind = Peek().kind;
    return kind == Kind::kVariableEnd || kind == Kind::kBlockEnd || kind == Kind::kEnd ||
           IsOp(")") || IsName("in") || IsName("if") || IsName("recursive");
  }

  ExprPtr ParseExpression(bool with_condition) {
    Nested nested(*this);
    return with_condition ? ParseCondition() : ParseOr();
  }

  ExprPtr ParseCondition() {
    ExprPtr expr = ParseOr();
    Chain chain(*this);
    while (IsName("if")) {
      chain.Link();
      const Token& at = Next();
      auto condition = Make(Expr::Kind::kCondition, at);
      condition->b = ParseOr();
      if (IsName("else")) {
        Next();
        condition->c = ParseCondition();
      }
      condition->a = std::move(expr);
      expr = std::move(condition);
    }
    return expr;
  }

  ExprPtr ParseOr() {
    ExprPtr left = ParseAnd();
    Chain chain(*this);
    while (IsName("or")) {
      chain.Link();
      auto node = Make(Expr::Kind::kOr, Next());
      node->a = std::move(left);
      node->b = ParseAnd();
      left = std::move(node);
    }
    return left;
  }

  ExprPtr ParseAnd() {
    ExprPtr left = ParseNot();
    Chain chain(*this);
    while (IsName("and")) {
      chain.Link();
      auto node = Make(Expr::Kind::kAnd, Next());
      node->a = std::move(left);
      node->b = ParseNot();
      left = std::move(node);
    }
    return left;
  }

  ExprPtr ParseNot() {
    Nested nested(*this);
    if (IsName("not")) {
      auto node = Make(Expr::Kind::kNot, Next());
      node->a = ParseNot();
      return node;
    }
    return ParseCompare();
  }

  ExprPtr ParseCompare() {
    const Token& start = Peek();
    ExprPtr first = ParseBinary(0);
    auto compare = Make(Expr::Kind::kCompare, start);
    while (true) {
      const Token& token = Peek();
      std::string op;
      if (token.kind == Kind::kOperator &&
          (token.value == "==" || token.value == "!=" || token.value == "<" ||
           token.value == "<=" || token.value == ">" || token.value == ">=")) {
        op = token.value;
        Next();
      } else if (IsName("in")) {
        op = "in";
        Next();
      } else if (IsName("not") && IsName("in", 1)) {
        op = "notin";
        Next();
        Next();
      } else {
        break;
      }
      compare->ops.push_back(op);
      compare->items.push_back(ParseBinary(0));
    }
    if (compare->ops.empty()) return first;
    compare->items.insert(compare->items.begin(), std::move(first));
    return compare;
  }

  // Binary operators by precedence level: + -, ~, * / // %, **.
  ExprPtr ParseBinary(int level) {
    static const std::vector<std::vector<std::string>> kLevels = {
        {"+", "-"}, {"~"}, {"*", "/", "//", "%"}, {"**"}};
    if (level == static_cast<int>(kLevels.size())) return ParseUnary(true);
    ExprPtr left = ParseBinary(level + 1);
    Chain chain(*this);
    while (true) {
      chain.Link();
      const Token& token = Peek();
      bool match = false;
      if (token.kind == Kind::kOperator) {
        for (const auto& op : kLevels[static_cast<size_t>(level)])
          match = match || token.value == op;
      }
      if (!match) return left;
      auto node = Make(Expr::Kind::kBinary, Next());
      node->name = token.value;
      node->a = std::move(left);
      node->b = ParseBinary(level + 1);
      left = std::move(node);
    }
  }

  ExprPtr ParseUnary(bool with_filter) {
    Nested nested(*this);
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      const Token& token = Next();
      node = Make(Expr::Kind::kUnary, token);
      node->name = token.value;
      node->a = ParseUnary(false);
    } else {
      node = ParsePrimary();
    }
    node = ParsePostfix(std::move(node));
    if (with_filter) node = ParseFilterExpression(std::move(node));
    return node;
  }

  // One case per kind of primary expression (literals, names, lists, dicts, tuples, parentheses):
  // the grammar's alternatives side by side.
  ExprPtr ParsePrimary() {
    Nested nested(*this);
    const Token& token = Next();
    switch (token.kind) {
      case Kind::kName: {
        auto node = Make(Expr::Kind::kLiteral, token);
        const std::string& n = token.value;
        if (n == "true" || n == "True") {
          node->literal = Value::Bool(true);
        } else if (n == "false" || n == "False") {
          node->literal = Value::Bool(false);
        } else if (n == "none" || n == "None") {
          node->literal = Value::None();
        } else {
          node->kind = Expr::Kind::kName;
          node->name = n;
        }
        return node;
      }
      case Kind::kString: {
        std::string text = token.value;
        while (Peek().kind == Kind::kString) text += Next().value;
        auto node = Make(Expr::Kind::kLiteral, token);
        node->literal = Value::String(std::move(text));
        return node;
      }
      case Kind::kInt:
      case Kind::kFloat: {
        auto node = Make(Expr::Kind::kLiteral, token);
        node->literal = NumberLiteral(token);
        return node;
      }
      case Kind::kOperator:
        if (token.value == "(") {
          ExprPtr inner = ParseTuple(true, true);
          ExpectOp(")");
          return inner;
        }
        if (token.value == "[") {
          auto node = Make(Expr::Kind::kList, token);
          while (!IsOp("]")) {
            if (!node->items.empty()) ExpectOp(",");
            if (IsOp("]")) break;
            node->items.push_back(ParseExpression(true));
          }
          Next();
          return node;
        }
        if (token.value == "{") {
          auto node = Make(Expr::Kind::kDict, token);
          while (!IsOp("}")) {
            if (!node->items.empty()) ExpectOp(",");
            if (IsOp("}")) break;
            node->items.push_back(ParseExpression(true));
            ExpectOp(":");
            node->items.push_back(ParseExpression(true));
          }
          Next();
          return node;
        }
        break;
      default:
        break;
    }
    Fail(token, "unexpected " + DescribeToken(token));
  }

  ExprPtr ParsePostfix(ExprPtr node) {
    Chain chain(*this);
    while (true) {
      chain.Link();
      if (IsOp(".")) {
        const Token& dot = Next();
        const Token& attr = Next();
        if (attr.kind == Kind::kName) {
          auto get = Make(Expr::Kind::kGetAttr, dot);
          get->name = attr.value;
          get->a = std::move(node);
          node = std::move(get);
        } else if (attr.kind == Kind::kInt) {
          auto get = Make(Expr::Kind::kGetItem, dot);
          get->b = Make(Expr::Kind::kLiteral, attr);
          get->b->literal = NumberLiteral(attr);
          get->a = std::move(node);
          node = std::move(get);
        } else {
          Fail(attr, "expected an attribute name after '.', got " + DescribeToken(attr));
        }
      } else if (IsOp("[")) {
        node = ParseSubscript(std::move(node));
      } else if (IsOp("(")) {
        node = ParseCall(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr ParseSubscript(ExprPtr object) {
    const Token& open = Next();
    std::vector<ExprPtr> parts(1);
    bool slice = false;
    while (!IsOp("]")) {
      if (IsOp(":")) {
        Next();
        slice = true;
        parts.emplace_back();
        if (parts.size() > 3) Fail(open, "a slice takes at most three parts");
      } else if (parts.back() == nullptr) {
        parts.back() = ParseTuple(true, false);
      } else {
        Fail(Peek(), "expected ']', got " + DescribeToken(Peek()));
      }
    }
    Next();
    if (slice) {
      auto node = Make(Expr::Kind::kSlice, open);
      node->a = std::move(object);
      parts.resize(3);
      node->items = std::move(parts);
      return node;
    }
    if (parts[0] == nullptr) Fail(open, "expected a subscript inside '[]'");
    auto node = Make(Expr::Kind::kGetItem, open);
    node->a = std::move(object);
    node->b = std::move(parts[0]);
    return node;
  }

  void ParseArguments(Expr& call) {
    ExpectOp("(");
    bool first = true;
    while (!IsOp(")")) {
      if (!first) ExpectOp(",");
      first = false;
      if (IsOp(")")) break;
      if (IsOp("*") || IsOp("**")) Fail(Peek(), "argument unpacking (* and **) is not supported");
      if (Peek().kind == Kind::kName && IsOp("=", 1)) {
        std::string name = Next().value;
        Next();
        call.kwargs.emplace_back(name, ParseExpression(true));
      } else {
        if (!call.kwargs.empty()) Fail(Peek(), "positional argument follows keyword argument");
        call.items.push_back(ParseExpression(true));
      }
    }
    Next();
  }

  ExprPtr ParseCall(ExprPtr callee) {
    auto node = Make(Expr::Kind::kCall, Peek());
    node->a = std::move(callee);
    ParseArguments(*node);
    return node;
  }

  ExprPtr ParseFilterExpression(ExprPtr node) {
    Chain chain(*this);
    while (true) {
      chain.Link();
      if (IsOp("|")) {
        Next();
        node = ParseFilter(std::move(node));
      } else if (IsName("is")) {
        node = ParseTest(std::move(node));
      } else if (IsOp("(")) {
        node = ParseCall(std::move(node));
      } else {
        return node;
      }
    }
  }

  std::string DottedName() {
    std::string name = ExpectName();
    while (IsOp(".")) {
      Next();
      name += "." + ExpectName();
    }
    return name;
  }

  ExprPtr ParseFilter(ExprPtr operand) {
    const Token& at = Peek();
    auto node = Make(Expr::Kind::kFilter, at);
    node->name = DottedName();
    if (!IsKnownFilter(node->name)) Fail(at, "no filter named '" + node->name + "'");
    node->a = std::move(operand);
    if (IsOp("(")) ParseArguments(*node);
    return node;
  }

  ExprPtr ParseTest(ExprPtr operand) {
    auto node = Make(Expr::Kind::kTest, Next());
    if (IsName("not")) {
      Next();
      node->negated = true;
    }
    const Token& at = Peek();
    node->name = DottedName();
    if (!IsKnownTest(node->name)) Fail(at, "no test named '" + node->name + "'");
    node->a = std::move(operand);
    const Token& next = Peek();
    if (IsOp("(")) {
      ParseArguments(*node);
    } else if ((next.kind == Kind::kName || next.kind == Kind::kString || next.kind == Kind::kInt ||
                next.kind == Kind::kFloat || IsOp("[") || IsOp("{")) &&
               !IsName("else") && !IsName("or") && !IsName("and") && !IsName("if") &&
               !IsName("in") && !IsName("not") && !IsName("is")) {
      node->items.push_back(ParsePostfix(ParsePrimary()));
    }
    return node;
  }

  const std::vector<Token>& tokens_;
  size_t pos_ = 0;
  int loop_depth_ = 0;
  int depth_ = 0;
};

}  // namespace

StatusOr<Body> Parse(const std::vector<Token>& tokens) {
  try {
    return Parser(tokens).ParseTemplate();
  } catch (const ParseError& error) {
    return InvalidArgumentError(std::to_string(error.line) + ":" + std::to_string(error.column) +
                                ": " + error.message);
  }
}

}  // namespace engine::jinja
