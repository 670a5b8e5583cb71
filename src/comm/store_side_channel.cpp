// The store side channel (store_side_channel.h).
#include "store_side_channel.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "comm_errors.h"

namespace dscpp {
namespace {

// Integers as a store value and back.
std::vector<uint8_t> to_bytes(const std::vector<int64_t>& values) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(values.data());
  return std::vector<uint8_t>(bytes, bytes + values.size() * sizeof(int64_t));
}

std::vector<int64_t> from_bytes(const std::vector<uint8_t>& bytes) {
  std::vector<int64_t> values(bytes.size() / sizeof(int64_t));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(int64_t));
  return values;
}

// Keys "<name>/<index mod kSlots>/<from>/<to>": one copy of a record per reader, deleted by it once read.
class StoreSideStream final : public SideStream {
 public:
  StoreSideStream(const c10d::TCPStore& server, std::chrono::milliseconds timeout, std::string name, int rank,
                  int world_size)
      : name_(std::move(name)), rank_(rank), timeout_(timeout) {
    if (rank == 0) {
      for (int r = 1; r < world_size; ++r) peers_.push_back(r);
    } else {
      peers_.push_back(0);
    }
    free_below_.assign(peers_.size(), kSlots);
    c10d::TCPStoreOptions options;
    options.port = server.getPort();
    options.isServer = false;
    options.waitWorkers = false;
    options.timeout = timeout;
    try {
      poster_ = c10::make_intrusive<c10d::TCPStore>(server.getHost(), options);
      reader_ = c10::make_intrusive<c10d::TCPStore>(server.getHost(), options);
    } catch (const std::exception& e) {
      throw CommError(where() + "could not connect to the rendezvous store: " + reason(e));
    }
  }

  const std::vector<int>& peers() const override { return peers_; }

  void post(int64_t index, const std::vector<int64_t>& values) override {
    const auto value = to_bytes(values);
    try {
      for (size_t p = 0; p < peers_.size(); ++p) {
        if (index >= free_below_[p]) free_below_[p] = wait_until_read(index - kSlots / 2, peers_[p]);
        poster_->set(key(index, rank_, peers_[p]), value);
      }
    } catch (const CommError&) {
      throw;
    } catch (const std::exception& e) {
      throw CommError(where() + "posting record " + std::to_string(index) + " failed: " + reason(e) +
                      ". A peer rank probably died; see its log.");
    }
  }

  std::vector<int64_t> read(int rank, int64_t index) override {
    const std::string k = key(index, rank, rank_);
    std::vector<uint8_t> got;
    try {
      got = reader_->get(k);
      reader_->deleteKey(k);
    } catch (const std::exception& e) {
      throw CommError(where() + "reading rank " + std::to_string(rank) + "'s record " + std::to_string(index) +
                      " failed: " + reason(e) + ". A peer rank probably died; see its log.");
    }
    return from_bytes(got);
  }

 private:
  // Record i's key is named by i mod kSlots: a TCPStore may keep memory for every key name it has seen, deleted or
  // not (torch 1.13's kept about 125 bytes a name), and ZeRO-3's order check posts a record per gather — unique names
  // grew rank 0 (the store's host) by 2.8 KB a step there (bench/soak). A name is reused only once its reader has deleted the record before.
  static constexpr int64_t kSlots = 1024;
  std::string key(int64_t index, int from, int to) const {
    return name_ + "/" + std::to_string(index % kSlots) + "/" + std::to_string(from) + "/" + std::to_string(to);
  }
  // Waits until `peer` has read (and so deleted) record `record`, and returns the first index whose name may still
  // hold an unread record. The peer reads in order, so every record up to `record` is gone too and the names of
  // records up to record + kSlots - 1 are free: asked every kSlots / 2 records, this costs the posting thread one
  // store round trip per 512 records, not one per record. Only this rank writes the name and only the peer deletes
  // it, and no later record has been posted under it, so "absent" means "read". Ranks meet in a collective every few
  // records, so the peer is never kSlots / 2 behind in practice and this returns at once; the poll covers the case
  // that cannot be ruled out, bounded by the store's timeout.
  int64_t wait_until_read(int64_t record, int peer) {
    const std::string k = key(record, rank_, peer);
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (auto pause = std::chrono::microseconds(50); poster_->check({k});
         pause = std::min(pause * 2, std::chrono::microseconds(20'000))) {
      if (std::chrono::steady_clock::now() > deadline) {
        throw CommError(where() + "rank " + std::to_string(peer) + " has not read record " + std::to_string(record) +
                        " within the store's timeout; it probably died or is stuck");
      }
      std::this_thread::sleep_for(pause);
    }
    return record + kSlots;
  }
  std::string where() const { return "rank " + std::to_string(rank_) + ": side stream " + name_ + ": "; }

  std::string name_;
  int rank_;
  std::chrono::milliseconds timeout_;
  std::vector<int> peers_;
  std::vector<int64_t> free_below_;  // per peer: records below this index may be posted without asking (see above)
  c10::intrusive_ptr<c10d::TCPStore> poster_;  // used by the posting thread only
  c10::intrusive_ptr<c10d::TCPStore> reader_;  // used by the reading thread only
};

}  // namespace

// Keys "dscpp/side/<call mod 4>/<rank>". A rank deletes its own key of call k-2 during call k, so the store holds at
// most a few calls' keys. That is safe: any rank r read our key of call k-2 during its call k-2, before it set its key
// of call k-1; and we finished call k-1 only after reading r's key of call k-1. The names are reused mod 4, because
// a TCPStore may keep memory for every key name it has seen, deleted or not (measured on torch 1.13's: about 125
// bytes a name; 20,000 distinct keys grew the store's process by 2.5 MB, 8 reused names not at all). Reuse is safe: call k's name last
// named call k-4's key, which its rank deleted at the end of its call k-2 — before it set its key of call k-1, which
// any reader of call k has read.
std::vector<int64_t> store_all_gather(c10d::Store& store, int64_t call, int rank, int world_size,
                                      const std::vector<int64_t>& values, const std::string& where) {
  auto key = [](int64_t c, int r) { return "dscpp/side/" + std::to_string(c % 4) + "/" + std::to_string(r); };
  std::vector<int64_t> all(values.size() * static_cast<size_t>(world_size));
  try {
    store.set(key(call, rank), to_bytes(values));
    std::copy(values.begin(), values.end(), all.begin() + static_cast<std::ptrdiff_t>(rank * values.size()));
    for (int r = 0; r < world_size; ++r) {
      // Our own values need no round trip through the store (one get in three fewer for two ranks).
      if (r == rank) continue;
      const auto got = from_bytes(store.get(key(call, r)));  // waits for rank r, up to the store's timeout
      if (got.size() != values.size()) {
        throw CommError(where + "side_all_gather #" + std::to_string(call) + ": rank " + std::to_string(r) +
                        " sent " + std::to_string(got.size()) + " values, this rank " + std::to_string(values.size()));
      }
      std::copy(got.begin(), got.end(), all.begin() + static_cast<std::ptrdiff_t>(r * values.size()));
    }
    if (call >= 2) store.deleteKey(key(call - 2, rank));
  } catch (const CommError&) {
    throw;
  } catch (const std::exception& e) {
    throw CommError(where + "side_all_gather #" + std::to_string(call) + " through the store failed: " + reason(e) +
                    ". A peer rank probably died or is stuck; see its log.");
  }
  return all;
}

c10d::TCPStore* tcp_store_under(c10d::Store* store) {
  while (store != nullptr) {
    if (auto* tcp = dynamic_cast<c10d::TCPStore*>(store)) return tcp;
    auto* prefixed = dynamic_cast<c10d::PrefixStore*>(store);
    if (prefixed == nullptr) return nullptr;
    store = prefixed->getUnderlyingStore().get();
  }
  return nullptr;
}

std::unique_ptr<SideStream> make_store_side_stream(const c10d::TCPStore& server, std::chrono::milliseconds timeout,
                                                   std::string name, int rank, int world_size) {
  return std::make_unique<StoreSideStream>(server, timeout, std::move(name), rank, world_size);
}

}  // namespace dscpp
