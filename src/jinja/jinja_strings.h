// Python-compatible text helpers for the chat-template interpreter: UTF-8 code points, Python's
// whitespace, the str methods templates call (strip, split, replace, ...) and Python's repr().
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace inferd::jinja {

// next_code_point() returns this plus the byte for an ill-formed byte: outside Unicode, so it is
// never whitespace or a letter, and append_utf8() writes the byte back unchanged.
inline constexpr char32_t kIllFormedBase = 0x110000;

// Decodes the code point that starts at s[*i] and advances *i past it. An ill-formed byte is
// returned as itself (one unit), so every byte string splits into units without loss.
char32_t next_code_point(std::string_view s, size_t* i);
void append_utf8(char32_t c, std::string* out);
size_t count_code_points(std::string_view s);
// Byte offset where each code point starts, then s.size(): [count_code_points(s) + 1].
std::vector<size_t> code_point_offsets(std::string_view s);

// Python's str.isspace() for one code point (also what `\s` matches in Python's re).
bool is_py_space(char32_t c);

// str.strip / lstrip / rstrip: removes whitespace, or any code point of `chars` when given.
std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);
// str.split / str.rsplit; no `sep` splits on runs of whitespace. maxsplit < 0 means no limit.
// An empty `sep` is the caller's error to report (Python raises ValueError).
std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep,
                                  int64_t maxsplit);
std::vector<std::string> py_rsplit(std::string_view s, const std::optional<std::string>& sep,
                                   int64_t maxsplit);
// str.replace; count < 0 replaces every occurrence. An empty `old` inserts between code points.
std::string py_replace(std::string_view s, std::string_view old, std::string_view replacement, int64_t count);
// str.find (code-point index, -1 when absent) and str.count.
int64_t py_find(std::string_view s, std::string_view sub);
int64_t py_count(std::string_view s, std::string_view sub);

// str.upper() / str.lower(): Unicode simple case mapping (utf8proc), plus ß -> "SS".
std::string py_upper(std::string_view s);
std::string py_lower(std::string_view s);
// str.capitalize(): first code point title-cased, the rest lower-cased.
std::string py_capitalize(std::string_view s);
// str.title(): a cased letter after an uncased one is title-cased, the others lower-cased.
std::string py_title(std::string_view s);
// Jinja's `title` filter: the first code point of every word (words start after whitespace or
// one of -({[<) upper-cased, the rest lower-cased.
std::string jinja_title(std::string_view s);
// Unicode classes as Python's str.isalpha() / isdigit() / islower() ... test them.
bool is_py_alpha(char32_t c);
bool is_py_digit(char32_t c);
bool is_py_cased(char32_t c);
bool is_py_lower(char32_t c);
bool is_py_upper(char32_t c);

}  // namespace inferd::jinja
