// The store side channel: small integer exchanges through the rendezvous store instead of the process group, so
// they never queue behind (or deadlock with) a collective — every rank's values (store_all_gather), and ordered
// record streams between rank 0 and the others over connections of their own (StoreSideStream).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "c10d_headers.h"
#include "dscpp/comm/comm.h"

namespace dscpp {

// Every rank's `values` (the same count on each), in rank order, through `store`. `call` numbers this rank's calls
// (0, 1, …; every rank makes the same calls in the same order) and names their keys; `where` starts error texts.
// CommError when a peer is gone past the store's timeout or sent another count.
std::vector<int64_t> store_all_gather(c10d::Store& store, int64_t call, int rank, int world_size,
                                      const std::vector<int64_t>& values, const std::string& where);

// The TCPStore under `store` and any PrefixStores around it, or nullptr (a store of another kind): where side streams
// and the start-up watch open connections of their own.
c10d::TCPStore* tcp_store_under(c10d::Store* store);

// A side stream named `name` between this rank and its peers (rank 0 and every other rank) over two new
// connections to `server`.
std::unique_ptr<SideStream> make_store_side_stream(const c10d::TCPStore& server, std::chrono::milliseconds timeout,
                                                   std::string name, int rank, int world_size);

}  // namespace dscpp
