// Which address Gloo binds to without GLOO_SOCKET_IFNAME: the rules on made-up hosts (two hosts on a veth pair, a
// container whose hostname resolves to loopback, a master reached through a gateway), and the real lookup on this one.
#include "dscpp/comm/gloo_interface.h"

#include <gtest/gtest.h>

#include "dscpp/comm/comm.h"
#include "../common/error_of.h"

namespace dscpp {
namespace {

using dscpp::testing::error_of;

NetAddress iface(const std::string& name, const std::string& address, int prefix, bool up = true) {
  auto a = parse_numeric_address(address);
  EXPECT_TRUE(a.has_value()) << address;
  a->interface = name;
  a->prefix_length = prefix;
  a->up = up;
  return *a;
}

// node1 of the two namespaces: lo and dsv2 10.231.0.2/24; its hostname resolves to 127.0.0.1.
BindingInputs node1(const std::string& master = "10.231.0.1") {
  BindingInputs in;
  in.master_addr = master;
  if (auto m = parse_numeric_address(master)) in.master = {*m};
  in.local = {iface("lo", "127.0.0.1", 8), iface("dsv2", "10.231.0.2", 24)};
  in.multi_node = true;
  in.hostname = "vm";
  in.hostname_resolves_to = {"127.0.0.1"};
  return in;
}

TEST(GlooBinding, TheMasterBindsTheInterfaceThatHoldsItsAddress) {
  auto in = node1();
  in.local = {iface("lo", "127.0.0.1", 8), iface("dsv1", "10.231.0.1", 24)};
  const auto b = choose_gloo_binding(in);
  EXPECT_EQ(b.interface, "dsv1");
  EXPECT_EQ(b.address, "10.231.0.1");
  EXPECT_EQ(b.reason, "the interface holds MASTER_ADDR");
}

TEST(GlooBinding, AnotherHostBindsTheInterfaceTheKernelRoutesTheMasterThrough) {
  auto in = node1("10.9.0.1");  // on no local subnet: reached through a gateway on eth1
  in.local.push_back(iface("eth1", "192.168.5.7", 24));
  in.route_source = "192.168.5.7";
  const auto b = choose_gloo_binding(in);
  EXPECT_EQ(b.interface, "eth1");
  EXPECT_EQ(b.address, "192.168.5.7");
  EXPECT_EQ(b.reason, "the route to MASTER_ADDR goes through it");
}

TEST(GlooBinding, WithoutARouteTheInterfaceOnTheMastersSubnet) {
  auto in = node1();
  in.local.insert(in.local.begin() + 1, iface("eth0", "192.0.2.2", 24));  // listed first, wrong subnet
  const auto b = choose_gloo_binding(in);
  EXPECT_EQ(b.interface, "dsv2");
  EXPECT_EQ(b.address, "10.231.0.2");
  EXPECT_EQ(b.reason, "it is on MASTER_ADDR's subnet");
}

TEST(GlooBinding, ADownInterfaceIsNotChosen) {
  auto in = node1();
  in.local = {iface("lo", "127.0.0.1", 8), iface("dsv2", "10.231.0.2", 24, /*up=*/false)};
  EXPECT_THROW(choose_gloo_binding(in), CommError);
}

// The failure: the hostname resolves to loopback, and nothing reaches the master. Loopback must not be
// advertised to other hosts; the error says what was seen and how to fix it.
TEST(GlooBinding, NeverLoopbackForAJobOnSeveralHosts) {
  auto in = node1();
  in.local = {iface("lo", "127.0.0.1", 8), iface("eth0", "192.0.2.2", 24)};
  in.route_source = "127.0.0.1";  // as a broken route table could say
  const std::string message = error_of([&] { choose_gloo_binding(in); });
  for (const std::string part : {"MASTER_ADDR '10.231.0.1' resolved to 10.231.0.1", "this host's name 'vm' resolves "
                                 "to 127.0.0.1", "lo 127.0.0.1/8", "eth0 192.0.2.2/24", "GLOO_SOCKET_IFNAME"})
    EXPECT_NE(message.find(part), std::string::npos) << part << "\n" << message;
}

TEST(GlooBinding, AMasterWhoseAddressIsThisHostsLoopbackStopsAMultiNodeJob) {
  auto in = node1("127.0.1.1");
  in.local = {iface("lo", "127.0.1.1", 8)};
  const std::string message = error_of([&] { choose_gloo_binding(in); });
  EXPECT_NE(message.find("loopback"), std::string::npos) << message;
}

TEST(GlooBinding, ASingleHostJobMayUseLoopback) {
  auto in = node1("127.0.1.1");  // Debian's convention for the hostname; lo holds only 127.0.0.1
  in.multi_node = false;
  const auto b = choose_gloo_binding(in);
  EXPECT_EQ(b.interface, "lo");
  EXPECT_EQ(b.address, "127.0.1.1");
}

TEST(GlooBinding, AMasterThatDoesNotResolveIsNamed) {
  auto in = node1();
  in.master_addr = "no-such-host.invalid";
  in.master.clear();
  const std::string message = error_of([&] { choose_gloo_binding(in); });
  EXPECT_NE(message.find("MASTER_ADDR does not resolve"), std::string::npos) << message;
  EXPECT_NE(message.find("'no-such-host.invalid' resolved to nothing"), std::string::npos) << message;
}

TEST(GlooBinding, IPv6SubnetsCompareByPrefix) {
  auto in = node1("fd00:1::1");
  in.local = {iface("lo", "::1", 128), iface("eth0", "fd00:2::5", 64), iface("eth1", "fd00:1::7", 64)};
  EXPECT_EQ(choose_gloo_binding(in).interface, "eth1");
}

// On this host: its own non-loopback address is held by an interface, found by the real lookup.
TEST(GlooBinding, TheRealLookupFindsThisHostsInterfaces) {
  const auto here = gather_binding_inputs("127.0.0.1", 29500, false);
  ASSERT_FALSE(here.local.empty());
  const NetAddress* outside = nullptr;
  for (const auto& a : here.local)
    if (!a.loopback && a.up && a.bytes.size() == 4) outside = &a;
  if (outside == nullptr) GTEST_SKIP() << "this host has no IPv4 address besides loopback";
  const auto in = gather_binding_inputs(outside->address, 29500, true);
  ASSERT_EQ(in.master.size(), 1u);
  ASSERT_TRUE(in.route_source.has_value());
  const auto b = choose_gloo_binding(in);
  EXPECT_EQ(b.interface, outside->interface);
  EXPECT_EQ(b.address, outside->address);
}

}  // namespace
}  // namespace dscpp
