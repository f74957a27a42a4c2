// Connection: one binary-carrier connection, its requests and replies.
#include "rlserve/connection.hpp"

#include <algorithm>
#include <thread>

#include "rlserve/codec.hpp"
#include "rlserve/requests.hpp"

namespace rlserve {
namespace {

void set_id(Value& message, std::uint64_t id) {
  if (auto* m = message.as_map()) {
    for (auto& [key, value] : *m) {
      if (key == "id") {
        value = Value(id);
        return;
      }
    }
    m->emplace(m->begin() + (m->empty() ? 0 : 1), "id", Value(id));
  }
}

std::string type_of(const Value& message) {
  const Value* t = message.present("type");
  return t != nullptr && t->as_string() != nullptr ? *t->as_string() : "request";
}

}  // namespace

std::vector<std::string> episodes_of(const Value& message) {
  std::vector<std::string> out;
  if (type_of(message) == "start_episode") return out;
  if (const Value* ids = message.present("episode_ids"); ids && ids->as_array()) {
    for (const Value& v : *ids->as_array()) {
      if (v.as_string()) out.push_back(*v.as_string());
    }
  } else if (const Value* id = message.present("episode_id"); id && id->as_string()) {
    out.push_back(*id->as_string());
  }
  return out;
}

Connection::Connection(Address address, ConnectionOptions options)
    : Connection(std::vector<Address>{std::move(address)}, std::move(options)) {}

Connection::Connection(std::vector<Address> front_ends, ConnectionOptions options)
    : front_ends_(std::move(front_ends)), options_(std::move(options)) {}

std::string Connection::front_end_names() const {
  std::string out;
  for (const auto& a : front_ends_) out += (out.empty() ? "" : ", ") + a.text();
  return out;
}

Result<Welcome> Connection::open() {
  std::optional<Error> failure;
  for (std::size_t k = 0; k < front_ends_.size(); ++k) {
    const std::size_t i = (index_ + k) % front_ends_.size();
    auto w = open_at(i);
    if (w || !is_connection_failure(w.error())) return w;
    failure = w.error();
  }
  if (front_ends_.size() > 1) {
    return make_error(failure->code, "no front-end of " + front_end_names() + " answered (the last: " + failure->message + ")");
  }
  return *failure;
}

Status Connection::check_served(std::size_t index, const Welcome& w) {
  if (!first_) {
    first_.emplace(index, w);
    return ok_status();
  }
  const Welcome& f = first_->second;
  if (front_ends_.size() > 1 && (w.policies != f.policies || w.mapping != f.mapping || w.multi_agent != f.multi_agent)) {
    const std::string name = front_ends_[index].text();
    return make_error(ErrorCode::invalid_argument,
                      "front-end " + name + " serves other policies or spaces than " + front_ends_[first_->first].text() +
                          ", the first front-end this client reached; every address given to the client must be a "
                          "front-end of the same run: remove '" + name + "' from the list");
  }
  return ok_status();
}

Error Connection::lost(Error why) {
  std::lock_guard<std::mutex> lock(transport_mutex_);
  transport_.reset();
  return why;
}

void Connection::drop() noexcept {
  std::lock_guard<std::mutex> lock(transport_mutex_);
  if (transport_) transport_->shutdown();
  transport_.reset();
}

void Connection::interrupt() noexcept {
  interrupted_ = true;
  std::lock_guard<std::mutex> lock(transport_mutex_);
  if (transport_) transport_->shutdown();  // the owner's blocked read returns; it resets the pointer
}

Error Connection::interrupted_error() const {
  return make_error(ErrorCode::connection_lost, "the connection to " + address().text() + " was closed by close()");
}

Result<Welcome> Connection::open_at(std::size_t index) {
  drop();
  index_ = index;
  if (interrupted_) return interrupted_error();
  auto t = dial(address(), options_.timeouts.connect, options_.tls_ca);
  if (!t) return t.error();
  {
    std::lock_guard<std::mutex> lock(transport_mutex_);
    transport_ = std::move(*t);
    if (interrupted_) transport_->shutdown();  // interrupt() came while dialling
  }
  reader_ = FrameReader(Limits{}.max_frame_bytes);
  limits_ = Limits{};
  unanswered_.clear();
  replies_.clear();
  Hello h;
  h.client_name = options_.client_name;
  if (!options_.token.empty()) h.token = options_.token;
  h.inference_mode = options_.inference_mode;
  if (!options_.client_id.empty()) h.client_id = options_.client_id;
  Value hello = hello_request(0, h);
  auto reply = request(std::move(hello), false);  // an error kept from before is the next call's
  if (!reply) {
    const Error& e = reply.error();
    if (e.code == ErrorCode::decode_error || e.code == ErrorCode::frame_too_large || e.code == ErrorCode::limit_exceeded) {
      drop();
      return make_error(ErrorCode::decode_error,
                        "the peer at " + address().text() + " did not answer hello as an rlserve server (" + e.message +
                            "); check the address: it must be the server's binary port");
    }
    if (e.code == ErrorCode::connection_lost && !address().tls) {
      return make_error(ErrorCode::connection_lost, e.message + " (if the server serves TLS, connect to tls://" +
                                                        address().host + ":" + std::to_string(address().port) + ")");
    }
    if (!is_connection_failure(e)) drop();  // the server closes after a refused hello
    return reply.error();
  }
  auto welcome = read_welcome(*reply);
  if (!welcome) {
    drop();
    return make_error(ErrorCode::decode_error, "the server's welcome is malformed: " + welcome.error().message);
  }
  if (welcome->protocol_version != kProtocolVersion) {
    drop();
    return make_error(ErrorCode::version_mismatch, "the server speaks protocol version " +
                                                       std::to_string(welcome->protocol_version) + ", this client " +
                                                       std::to_string(kProtocolVersion) + "; use matching versions");
  }
  if (auto s = check_served(index, *welcome); !s) {
    drop();
    return s.error();
  }
  welcome_ = *welcome;
  welcomed_ = true;
  lost_since_.reset();
  limits_ = welcome_.limits;
  reader_.set_max_frame_bytes(limits_.max_frame_bytes);
  return welcome_;
}

Result<Welcome> Connection::reconnect(Clock::time_point deadline) {
  drop();
  double delay = 0.05;
  for (;;) {
    const auto now = Clock::now();
    if (!lost_since_) lost_since_ = now;
    std::vector<std::size_t> order{index_};
    if (front_ends_.size() > 1 && now - *lost_since_ >= std::chrono::duration<double>(kSameFrontEndGrace)) {
      order.clear();  // the others in turn from the one after it, itself last
      for (std::size_t k = 1; k <= front_ends_.size(); ++k) order.push_back((index_ + k) % front_ends_.size());
    }
    std::optional<Error> failure;
    for (std::size_t i : order) {
      auto w = open_at(i);
      if (w) {
        ++reconnects_;
        return w;
      }
      if (!is_connection_failure(w.error())) return w.error();
      failure = w.error();
    }
    if (interrupted_) return interrupted_error();
    if (Clock::now() + std::chrono::duration<double>(delay) > deadline) {
      return make_error(ErrorCode::connection_lost,
                        "lost the connection to " + front_end_names() + " and could not reconnect within " +
                            std::to_string(static_cast<int>(options_.timeouts.reconnect)) + " s (" + failure->message +
                            "); start the server or raise the reconnect timeout");
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(delay));
    delay = std::min(delay * 2, 2.0);
  }
}

Result<std::uint64_t> Connection::send(Value& message) {
  if (interrupted_) return interrupted_error();
  if (!transport_) return make_error(ErrorCode::connection_lost, "the connection to " + address().text() + " is closed");
  const std::uint64_t id = next_id_;
  set_id(message, id);
  const auto body = encode(message);
  if (body.size() > limits_.max_frame_bytes) {
    return make_error(ErrorCode::frame_too_large, "a " + type_of(message) + " of " + std::to_string(body.size()) +
                                                      " bytes is over the server's frame limit of " +
                                                      std::to_string(limits_.max_frame_bytes) + " bytes; send less per call");
  }
  auto frame = frame_body(body, limits_.max_frame_bytes);
  if (!frame) return frame.error();
  ++next_id_;
  if (auto s = transport_->send_all(frame->data(), frame->size()); !s) {
    return lost(make_error(ErrorCode::connection_lost, "sending to " + address().text() + " failed: " + s.error().message));
  }
  return id;
}

Status Connection::receive_some() {
  if (!transport_) return make_error(ErrorCode::connection_lost, "the connection to " + address().text() + " is closed");
  std::uint8_t buffer[1 << 16];
  auto n = transport_->receive(buffer, sizeof buffer, options_.timeouts.request);
  if (interrupted_ && (!n || *n == 0)) return lost(interrupted_error());
  if (!n) {
    if (n.error().code == ErrorCode::timeout) {
      return lost(make_error(ErrorCode::timeout, "no reply from " + address().text() + " within " +
                                                     std::to_string(options_.timeouts.request) + " s"));
    }
    return lost(n.error());
  }
  if (*n == 0) {
    return lost(make_error(ErrorCode::connection_lost, "the server at " + address().text() + " closed the connection"));
  }
  reader_.feed(buffer, *n);
  for (;;) {
    auto body = reader_.next();
    if (!body) return lost(body.error());
    if (!body->has_value()) return ok_status();
    auto message = decode_body((*body)->data(), (*body)->size(), limits_);
    if (!message) return lost(message.error());
    auto env = read_envelope(*message);
    if (!env) return lost(env.error());
    if (!env->id) {  // an error about no request (a frame it could not read, a timeout): fatal
      auto e = read_error(*message);
      if (!e) return lost(e.error());
      return lost(make_error(error_code_from_server(e->code), "the server closed the session: " + e->message));
    }
    const std::uint64_t id = *env->id;
    if (auto it = unanswered_.find(id); it != unanswered_.end()) {
      if (env->type == MessageType::error) refused_.push_back(it->second);
      if (env->type == MessageType::error && !deferred_) {
        auto e = read_error(*message);
        const std::string what = e ? e->message : "malformed error";
        auto eps = episodes_of(it->second);
        if (const Value* named = it->second.present("episode_id"); eps.empty() && named && named->as_string()) {
          eps.push_back(*named->as_string());  // a start_episode names the episode it opens
        }
        deferred_ = make_error(e ? error_code_from_server(e->code) : ErrorCode::decode_error,
                               type_of(it->second) + (eps.empty() ? "" : " of episode '" + eps[0] + "'") + " failed: " + what);
        deferred_message_ = it->second;
      }
      unanswered_.erase(it);
    } else {
      replies_[id] = std::move(*message);
    }
  }
}

Result<Value> Connection::read_until(std::uint64_t id) {
  while (replies_.find(id) == replies_.end()) {
    if (auto s = receive_some(); !s) return s.error();
  }
  Value reply = std::move(replies_[id]);
  replies_.erase(id);
  if (drop_next_reply_) {
    drop_next_reply_ = false;
    drop();
    return make_error(ErrorCode::connection_lost, "the reply was dropped (testing aid)");
  }
  return reply;
}

Status Connection::read_pipelined(bool starts_too) {
  const auto waited = [&] {
    for (const auto& [id, sent] : unanswered_) {
      if (starts_too || type_of(sent) != "start_episode") return true;
    }
    return false;
  };
  while (transport_ && waited()) {
    if (auto s = receive_some(); !s) return s.error();
  }
  return ok_status();
}

bool Connection::refused_in(const Value& message) const {
  if (!deferred_message_ || type_of(*deferred_message_) != "start_episode") return false;
  const Value* refused = deferred_message_->present("episode_id");
  if (refused == nullptr || refused->as_string() == nullptr) return false;
  for (const auto& id : episodes_of(message)) {
    if (id == *refused->as_string()) return true;
  }
  return false;
}

Error Connection::take_deferred() {
  Error e = *deferred_;
  failed_ = deferred_message_;
  deferred_.reset();
  deferred_message_.reset();
  return e;
}

Status Connection::settle() {
  if (auto s = read_pipelined(false); !s) return s;
  if (deferred_) return take_deferred();
  return ok_status();
}

Result<Value> Connection::request(Value message, bool raise_deferred) {
  if (!unanswered_.empty() || (raise_deferred && deferred_)) {
    if (auto s = read_pipelined(false); !s) return s.error();
    if (raise_deferred && deferred_) return take_deferred();
  }
  auto id = send(message);
  if (!id) return id.error();
  auto reply = read_until(*id);
  if (!reply) return reply.error();
  auto env = read_envelope(*reply);
  if (!env) return lost(env.error());
  if (env->type == MessageType::error) {
    // An earlier pipelined request's error is the cause to name first (e.g. the refused
    // start_episode of the episode this call acts in).
    if (deferred_ && (raise_deferred || refused_in(message))) return take_deferred();
    auto e = read_error(*reply);
    if (!e) return lost(e.error());
    return make_error(error_code_from_server(e->code), e->message);
  }
  return reply;
}

Status Connection::send_nowait(Value message, bool settle_first) {
  if (unanswered_.size() >= kMaxPipelined) {
    if (auto s = read_pipelined(true); !s) return s;
  }
  if (settle_first) {
    if (auto s = settle(); !s) return s;
  } else if (deferred_) {
    return take_deferred();
  }
  Value kept = message;
  auto id = send(message);
  if (!id) return id.error();
  unanswered_[*id] = std::move(kept);
  return ok_status();
}

std::vector<Value> Connection::take_unanswered() {
  std::vector<Value> out;
  for (auto& [id, message] : unanswered_) out.push_back(std::move(message));
  unanswered_.clear();
  return out;
}

Status Connection::close() {
  Status s = read_pipelined(true);
  if (s && deferred_) s = take_deferred();
  drop();
  return s;
}

}  // namespace rlserve
