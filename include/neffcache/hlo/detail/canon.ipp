// Definitions of hlo/detail/canon.hpp (core/decl.hpp).
#pragma once

#include <neffcache/hlo/detail/canon.hpp>

#include <algorithm>
#include <iterator>

#include <fmt/format.h>

namespace neffcache::detail::hlo {

NEFFCACHE_DECL Canonicalizer::Canonicalizer(std::string_view bytes, Sink sink)
    : data_(reinterpret_cast<const uint8_t*>(bytes.data())),
      stream_(data_, static_cast<int>(bytes.size())),
      sink_(std::move(sink)) {
  stream_.PushLimit(static_cast<int>(bytes.size()));
}

NEFFCACHE_DECL bool Canonicalizer::run(Msg top) {
  if (!walk(top, 0)) return false;
  if (top == Msg::hlo_proto && modules_ != 1)
    return fail(modules_ == 0 ? "no hlo_module field" : "more than one hlo_module field");
  flush();
  return true;
}

NEFFCACHE_DECL bool Canonicalizer::fail(std::string what) {
  if (error_.empty()) {
    error_ = std::move(what);
    error_offset_ = in_->CurrentPosition();
  }
  return false;
}

NEFFCACHE_DECL bool Canonicalizer::fail_in(const char* field) {
  error_ = fmt::format("{}{}{}", field, error_.find(": ") == std::string::npos ? ": " : ".", error_);
  return false;
}

NEFFCACHE_DECL void Canonicalizer::open_line(int depth, const Field* f, uint32_t number) {
  indent(depth);
  if (f) out_ += f->name;
  else fmt::format_to(std::back_inserter(out_), "#{}", number);
}

NEFFCACHE_DECL void Canonicalizer::append_hex(const uint8_t* p, std::size_t n) {
  static constexpr char k_digits[] = "0123456789abcdef";
  std::size_t at = out_.size();
  out_.resize(at + 2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    out_[at + 2 * i] = k_digits[p[i] >> 4];
    out_[at + 2 * i + 1] = k_digits[p[i] & 0xf];
  }
}

NEFFCACHE_DECL void Canonicalizer::append_quoted(std::string& out, std::string_view text) {
  out += '"';
  for (char ch : text) {
    auto c = static_cast<uint8_t>(ch);
    if (c == '"' || c == '\\') out += '\\', out += ch;
    else if (c >= 0x20 && c < 0x7f) out += ch;
    else fmt::format_to(std::back_inserter(out), "\\x{:02x}", c);
  }
  out += '"';
}

NEFFCACHE_DECL void Canonicalizer::close_group(Group& g) {
  if (g.field == 0) return;
  if (g.is_map) {
    std::sort(g.entries.begin(), g.entries.end());
    for (auto& e : g.entries) out_ += e;
    g.entries.clear();
  } else {
    out_ += "]\n";
  }
  g.field = 0;
  g.is_map = false;
}

NEFFCACHE_DECL void Canonicalizer::flush() {
  if (capturing_ == 0 && !out_.empty()) {
    sink_(out_);
    out_.clear();
  }
}

NEFFCACHE_DECL void Canonicalizer::append_int(int64_t v) {
  fmt::format_int f(v);
  out_.append(f.data(), f.size());
}

NEFFCACHE_DECL void Canonicalizer::append_id(Kind kind, uint64_t v) {
  bool instr = kind == Kind::instr_id || kind == Kind::instr_ids;
  out_ += instr ? '%' : '@';
  append_int(static_cast<int64_t>(renumber(instr ? instr_ids_ : comp_ids_, v)));
}

NEFFCACHE_DECL bool Canonicalizer::read_length(int& len) {
  if (!in_->ReadVarintSizeAsInt(&len)) return fail("bad length");
  if (len > in_->BytesUntilLimit()) return fail("truncated field");
  return true;
}

NEFFCACHE_DECL bool Canonicalizer::skip_field(int wire_type) {
  uint64_t v;
  uint32_t v32;
  int len;
  switch (wire_type) {
    case 0: return in_->ReadVarint64(&v) || fail("truncated varint");
    case 1: return in_->ReadLittleEndian64(&v) || fail("truncated fixed64");
    case 5: return in_->ReadLittleEndian32(&v32) || fail("truncated fixed32");
    case 2: return read_length(len) && (in_->Skip(len) || fail("truncated field"));
  }
  return fail(fmt::format("unsupported wire type {}", wire_type));
}

NEFFCACHE_DECL bool Canonicalizer::read_list(Group& g, const Field& f, int wire_type, int depth) {
  if (g.field != f.number) {
    close_group(g);
    g.field = f.number;
    open_line(depth, &f, f.number);
    out_ += " [";
  } else {
    out_ += ", ";
  }
  auto element = [&](uint64_t v, bool first) {
    if (!first) out_ += ", ";
    if (f.kind == Kind::ints) append_int(static_cast<int64_t>(v));
    else append_id(f.kind, v);
  };
  uint64_t v;
  if (wire_type == 0) {
    if (!in_->ReadVarint64(&v)) return fail("truncated varint");
    element(v, true);
    return true;
  }
  if (wire_type != 2) return fail(fmt::format("{} has wire type {}", f.name, wire_type));
  int len;
  if (!read_length(len)) return false;
  auto limit = in_->PushLimit(len);
  for (bool first = true; in_->BytesUntilLimit() > 0; first = false) {
    if (!in_->ReadVarint64(&v)) return fail("truncated packed varint");
    element(v, first);
  }
  in_->PopLimit(limit);
  return true;
}

NEFFCACHE_DECL bool Canonicalizer::read_raw(const Field* f, uint32_t number, int wire_type, int depth) {
  uint64_t v;
  uint32_t v32;
  int len;
  open_line(depth, f, number);
  switch (wire_type) {
    case 0:
      if (!in_->ReadVarint64(&v)) return fail("truncated varint");
      out_ += ' ';
      append_int(static_cast<int64_t>(v));
      out_ += '\n';
      return true;
    case 1:
      if (!in_->ReadLittleEndian64(&v)) return fail("truncated fixed64");
      fmt::format_to(std::back_inserter(out_), " f64:{:016x}\n", v);
      return true;
    case 5:
      if (!in_->ReadLittleEndian32(&v32)) return fail("truncated fixed32");
      fmt::format_to(std::back_inserter(out_), " f32:{:08x}\n", v32);
      return true;
    case 2:
      if (!read_length(len)) return false;
      out_ += " x:";
      append_hex(data_ + in_->CurrentPosition(), static_cast<std::size_t>(len));
      out_ += '\n';
      return in_->Skip(len) || fail("truncated field");
  }
  return fail(fmt::format("unsupported wire type {}", wire_type));
}

NEFFCACHE_DECL bool Canonicalizer::plausible_opcode(std::string_view s) {
  if (s.empty() || s.size() > 64 || s[0] < 'a' || s[0] > 'z') return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  });
}

NEFFCACHE_DECL bool Canonicalizer::walk(Msg type, int depth) {
  if (depth > k_max_depth) return fail(fmt::format("nested deeper than {}", k_max_depth));
  std::string relaid;
  if (!relay_if_unordered(relaid)) return walk_fields(type, depth);
  google::protobuf::io::CodedInputStream copy(reinterpret_cast<const uint8_t*>(relaid.data()),
                                               static_cast<int>(relaid.size()));
  copy.PushLimit(static_cast<int>(relaid.size()));
  auto* saved_in = std::exchange(in_, &copy);
  auto* saved_data = std::exchange(data_, reinterpret_cast<const uint8_t*>(relaid.data()));
  bool ok = walk_fields(type, depth);
  in_ = saved_in;
  data_ = saved_data;
  return ok;
}

NEFFCACHE_DECL bool Canonicalizer::relay_if_unordered(std::string& relaid) {
  const int start = in_->CurrentPosition();
  const int size = in_->BytesUntilLimit();
  if (size <= 0) return false;
  google::protobuf::io::CodedInputStream scan(data_ + start, size);
  auto& spans = spans_;  // reused: the scan ends before any nested walk starts
  spans.clear();
  bool ordered = true;
  for (uint32_t last = 0;;) {
    int begin = scan.CurrentPosition();
    uint32_t tag = scan.ReadTag();
    if (tag == 0) break;
    uint64_t v;
    uint32_t v32;
    int len;
    bool ok = false;
    switch (tag & 7) {
      case 0: ok = scan.ReadVarint64(&v); break;
      case 1: ok = scan.ReadLittleEndian64(&v); break;
      case 5: ok = scan.ReadLittleEndian32(&v32); break;
      case 2: ok = scan.ReadVarintSizeAsInt(&len) && scan.Skip(len); break;
    }
    if (!ok) return false;
    if ((tag >> 3) < last) ordered = false;
    last = tag >> 3;
    spans.push_back({tag >> 3, begin, scan.CurrentPosition()});
  }
  if (ordered || scan.CurrentPosition() != size) return false;
  std::stable_sort(spans.begin(), spans.end(),
                   [](const Span& a, const Span& b) { return a.number < b.number; });
  relaid.reserve(static_cast<std::size_t>(size));
  for (const auto& sp : spans)
    relaid.append(reinterpret_cast<const char*>(data_ + start + sp.begin),
                  static_cast<std::size_t>(sp.end - sp.begin));
  in_->Skip(size);
  return true;
}

NEFFCACHE_DECL bool Canonicalizer::walk_fields(Msg type, int depth) {
  const MessageSchema& schema = schema_of(type);
  Group group;
  bool has_opcode = false;
  std::size_t computations_before = comps_.size();
  if (type == Msg::computation) comps_.emplace_back();

  for (;;) {
    uint32_t tag = in_->ReadTag();
    if (tag == 0) {
      if (in_->BytesUntilLimit() != 0) return fail("invalid field tag");
      break;
    }
    uint32_t number = tag >> 3;
    int wire_type = static_cast<int>(tag & 7);
    const Field* f = schema.find(number);
    Kind kind = f ? f->kind : Kind::raw;
    if (group.field != number) close_group(group);

    switch (kind) {
      case Kind::drop:
        if (type == Msg::instruction && number == 7 && wire_type == 2) {
          if (!record_framework_op()) return false;
        } else if (!skip_field(wire_type)) {
          return false;
        }
        break;
      case Kind::raw:
        if (!read_raw(f, number, wire_type, depth)) return false;
        break;
      case Kind::ints:
      case Kind::instr_ids:
      case Kind::comp_ids:
        if (!read_list(group, *f, wire_type, depth)) return fail_in(f->name);
        break;
      case Kind::instr_id:
      case Kind::comp_id: {
        uint64_t v;
        if (wire_type != 0) return fail(fmt::format("{} has wire type {}", f->name, wire_type));
        if (!in_->ReadVarint64(&v)) return fail("truncated varint");
        open_line(depth, f, number);
        out_ += ' ';
        append_id(kind, v);
        out_ += '\n';
        if (type == Msg::computation && number == 5) comps_.back().old_id = v, comps_.back().has_id = true;
        if (type == Msg::module && number == 6) entry_id_ = v, has_entry_id_ = true;
        break;
      }
      case Kind::string: {
        int len;
        if (wire_type != 2) return fail(fmt::format("{} has wire type {}", f->name, wire_type));
        if (!read_length(len)) return fail_in(f->name);
        const uint8_t* p = data_ + in_->CurrentPosition();
        std::string_view text(reinterpret_cast<const char*>(p), static_cast<std::size_t>(len));
        if (type == Msg::instruction && number == 2) {
          if (!plausible_opcode(text)) {
            std::string shown;
            append_quoted(shown, text.substr(0, 64));
            return fail(fmt::format("implausible opcode {}", shown));
          }
          has_opcode = true;
          record_opcode(text);
        }
        if (type == Msg::instruction && number == 43)  // backend_config
          if (auto kernel = nki_kernel_path(text)) stats_.kernel_files.insert(std::move(*kernel));
        open_line(depth, f, number);
        out_ += ' ';
        append_quoted(out_, text);
        out_ += '\n';
        in_->Skip(len);
        break;
      }
      case Kind::message:
      case Kind::inline_module:
      case Kind::map_entry: {
        int len;
        if (wire_type != 2) return fail(fmt::format("{} has wire type {}", f->name, wire_type));
        if (!read_length(len)) return fail_in(f->name);
        bool ok;
        if (kind == Kind::inline_module) {
          ++modules_;
          auto limit = in_->PushLimit(len);
          ok = walk(f->msg, depth);
          in_->PopLimit(limit);
        } else {
          std::size_t start = out_.size();
          if (kind == Kind::map_entry) {
            group.field = number;
            group.is_map = true;
            ++capturing_;
          }
          open_line(depth, f, number);
          out_ += " {\n";
          auto limit = in_->PushLimit(len);
          ok = walk(f->msg, depth + 1);
          in_->PopLimit(limit);
          indent(depth);
          out_ += "}\n";
          if (kind == Kind::map_entry) {
            --capturing_;
            group.entries.emplace_back(out_, start);
            out_.resize(start);
          }
        }
        if (!ok) return fail_in(f->name);
        break;
      }
    }
  }
  close_group(group);

  if (type == Msg::instruction) {
    if (!has_opcode) return fail("instruction without opcode");
    ++stats_.instructions;
  } else if (type == Msg::module) {
    if (comps_.size() == computations_before) return fail("module without computations");
    finish_module(computations_before);
  }
  if (out_.size() >= k_flush_bytes) flush();
  return true;
}

NEFFCACHE_DECL void Canonicalizer::record_opcode(std::string_view op) {
  auto it = stats_.opcodes.find(op);
  if (it == stats_.opcodes.end()) it = stats_.opcodes.emplace(std::string(op), 0).first;
  ++it->second;
  if (op == "parameter" && !comps_.empty()) ++comps_.back().parameters;
}

NEFFCACHE_DECL bool Canonicalizer::record_framework_op() {
  int len;
  if (!read_length(len)) return fail_in("metadata");
  google::protobuf::io::CodedInputStream meta(data_ + in_->CurrentPosition(), len);
  for (uint32_t tag; (tag = meta.ReadTag()) != 0;) {
    uint64_t v;
    uint32_t v32;
    int n;
    bool ok = false;
    switch (tag & 7) {
      case 0: ok = meta.ReadVarint64(&v); break;
      case 1: ok = meta.ReadLittleEndian64(&v); break;
      case 5: ok = meta.ReadLittleEndian32(&v32); break;
      case 2:
        if (!meta.ReadVarintSizeAsInt(&n)) break;
        if (tag >> 3 != 1) {
          ok = meta.Skip(n);
          break;
        }
        if (std::string op; meta.ReadString(&op, n) && !op.empty()) ++stats_.framework_ops[op];
        break;  // op_type read (or unreadable): the rest is of no interest
    }
    if (!ok) break;
  }
  return in_->Skip(len) || fail("truncated field");
}

NEFFCACHE_DECL void Canonicalizer::finish_module(std::size_t first) {
  stats_.computations += comps_.size() - first;
  const Computation* entry = &comps_.back();
  if (has_entry_id_) {
    for (std::size_t i = first; i < comps_.size(); ++i)
      if (comps_[i].has_id && comps_[i].old_id == entry_id_) entry = &comps_[i];
  }
  stats_.entry_parameters = entry->parameters;
}

}  // namespace neffcache::detail::hlo
