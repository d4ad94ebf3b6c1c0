// A strict, minimal JSON parser for tests: it builds a small tree so tests can check both validity and content
// (stats JSON, trace files) without a JSON library. Not for production use: recursion depth is unbounded and
// numbers are kept as doubles.
#pragma once

#include <cctype>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvtier::testing {

struct JsonValue {
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject } type = Type::kNull;
  bool boolean = false;
  double number = 0;
  std::string string;
  std::vector<JsonValue> array;
  std::map<std::string, JsonValue> object;

  bool Has(const std::string& key) const { return type == Type::kObject && object.count(key) > 0; }
  const JsonValue& operator[](const std::string& key) const { return object.at(key); }
};

class MiniJsonParser {
 public:
  explicit MiniJsonParser(std::string_view text) : s_(text) {}

  // The value, or nullopt (with error()) if the text is not exactly one valid JSON value.
  std::optional<JsonValue> Parse() {
    JsonValue v;
    SkipSpace();
    if (!ParseValue(v)) return std::nullopt;
    SkipSpace();
    if (pos_ != s_.size()) return Fail("trailing characters");
    return v;
  }
  const std::string& error() const { return error_; }

 private:
  std::nullopt_t Fail(const std::string& what) {
    if (error_.empty()) error_ = what + " at offset " + std::to_string(pos_);
    return std::nullopt;
  }
  void SkipSpace() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\r' || s_[pos_] == '\t')) ++pos_;
  }
  bool Consume(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }
  bool ParseValue(JsonValue& v) {
    if (pos_ >= s_.size()) return (Fail("unexpected end"), false);
    char c = s_[pos_];
    if (c == '{') return ParseObject(v);
    if (c == '[') return ParseArray(v);
    if (c == '"') {
      v.type = JsonValue::Type::kString;
      return ParseString(v.string);
    }
    if (Consume("null")) return (v.type = JsonValue::Type::kNull, true);
    if (Consume("true")) return (v.type = JsonValue::Type::kBool, v.boolean = true, true);
    if (Consume("false")) return (v.type = JsonValue::Type::kBool, v.boolean = false, true);
    return ParseNumber(v);
  }
  bool ParseNumber(JsonValue& v) {
    size_t start = pos_;
    if (pos_ < s_.size() && s_[pos_] == '-') ++pos_;
    if (pos_ >= s_.size() || !std::isdigit(static_cast<unsigned char>(s_[pos_]))) return (Fail("bad value"), false);
    if (s_[pos_] == '0') {
      ++pos_;
    } else {
      while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    }
    if (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      if (pos_ >= s_.size() || !std::isdigit(static_cast<unsigned char>(s_[pos_])))
        return (Fail("bad fraction"), false);
      while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (pos_ >= s_.size() || !std::isdigit(static_cast<unsigned char>(s_[pos_])))
        return (Fail("bad exponent"), false);
      while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    }
    v.type = JsonValue::Type::kNumber;
    v.number = std::strtod(std::string(s_.substr(start, pos_ - start)).c_str(), nullptr);
    return true;
  }
  bool ParseString(std::string& out) {
    ++pos_;  // opening quote
    while (pos_ < s_.size()) {
      char c = s_[pos_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return (Fail("control character in string"), false);
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) break;
      char e = s_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          if (pos_ + 4 > s_.size()) return (Fail("short \\u escape"), false);
          for (int i = 0; i < 4; ++i) {
            if (!std::isxdigit(static_cast<unsigned char>(s_[pos_ + i]))) return (Fail("bad \\u escape"), false);
          }
          unsigned code = static_cast<unsigned>(std::strtoul(std::string(s_.substr(pos_, 4)).c_str(), nullptr, 16));
          pos_ += 4;
          out += code < 0x80 ? static_cast<char>(code) : '?';
          break;
        }
        default: return (Fail("bad escape"), false);
      }
    }
    return (Fail("unterminated string"), false);
  }
  bool ParseArray(JsonValue& v) {
    v.type = JsonValue::Type::kArray;
    ++pos_;
    SkipSpace();
    if (Consume("]")) return true;
    while (true) {
      JsonValue item;
      SkipSpace();
      if (!ParseValue(item)) return false;
      v.array.push_back(std::move(item));
      SkipSpace();
      if (Consume("]")) return true;
      if (!Consume(",")) return (Fail("expected ',' or ']'"), false);
    }
  }
  bool ParseObject(JsonValue& v) {
    v.type = JsonValue::Type::kObject;
    ++pos_;
    SkipSpace();
    if (Consume("}")) return true;
    while (true) {
      SkipSpace();
      if (pos_ >= s_.size() || s_[pos_] != '"') return (Fail("expected a key"), false);
      std::string key;
      if (!ParseString(key)) return false;
      SkipSpace();
      if (!Consume(":")) return (Fail("expected ':'"), false);
      SkipSpace();
      JsonValue item;
      if (!ParseValue(item)) return false;
      if (v.object.count(key) > 0) return (Fail("duplicate key " + key), false);
      v.object.emplace(std::move(key), std::move(item));
      SkipSpace();
      if (Consume("}")) return true;
      if (!Consume(",")) return (Fail("expected ',' or '}'"), false);
    }
  }

  std::string_view s_;
  size_t pos_ = 0;
  std::string error_;
};

}  // namespace kvtier::testing
