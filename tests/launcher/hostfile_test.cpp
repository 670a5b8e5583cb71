// Hostfile parsing and DeepSpeed's include/exclude filters: exact resources and every error message.
#include <gtest/gtest.h>

#include "expect_error.h"

#include <stdexcept>

#include "dscpp/launcher/hostfile.h"

namespace dscpp::launcher {
namespace {

const Resources kPool = {{"a", {0, 1, 2, 3}}, {"b", {0, 1}}, {"c", {0}}};

TEST(Hostfile, ParsesHostsCommentsAndBlankLines) {
  const Resources pool = parse_hostfile("# cluster\n\nworker-0 slots=4\n  worker-1\tslots=2   extra  \n", "hf");
  EXPECT_EQ(pool, (Resources{{"worker-0", {0, 1, 2, 3}}, {"worker-1", {0, 1}}}));
}

TEST(Hostfile, ErrorsNameFileAndLine) {
  expect_error([] { parse_hostfile("a slots=1\n\na slots=2\n", "hf"); }, "hf:3: host 'a' is listed twice");
  expect_error([] { parse_hostfile("a slots=x\n", "hf"); },
               "hf:1: bad slot count 'x' for host 'a' (expected a positive integer up to 1048576)");
  expect_error([] { parse_hostfile("# c\na slots=0\n", "hf"); },
               "hf:2: bad slot count '0' for host 'a' (expected a positive integer up to 1048576)");
  expect_error([] { parse_hostfile("a slots=-2\n", "hf"); },
               "hf:1: bad slot count '-2' for host 'a' (expected a positive integer up to 1048576)");
  expect_error([] { parse_hostfile("a slots=6666666\n", "hf"); },
               "hf:1: bad slot count '6666666' for host 'a' (expected a positive integer up to 1048576)");
  expect_error([] { parse_hostfile("a slots=1\nb 4\n", "hf"); }, "hf:2: expected 'HOST slots=N', got 'b 4'");
  expect_error([] { parse_hostfile("lonely\n", "hf"); }, "hf:1: expected 'HOST slots=N', got 'lonely'");
  expect_error([] { parse_hostfile("# only a comment\n\n", "hf"); },
               "hf: the hostfile lists no host ('HOST slots=N' lines)");
  expect_error([] { read_hostfile("/nonexistent/hostfile"); },
               "--hostfile '/nonexistent/hostfile': cannot read the file");
}

// Host names go onto ssh's and srun's command lines: a name ssh would read as an option, or a shell as code, is
// refused wherever a name comes from (hostfile, --include / --exclude, --world_info).
TEST(Hostfile, HostileHostNamesAreRefused) {
  const std::string rule = "is not allowed: a host name or IPv4 address (letters, digits, '.', '-', '_'; not starting "
                           "with '-' or '.')";
  for (const std::string bad : {"-oProxyCommand=touch${IFS}/tmp/x", "w1;reboot", "$(id)", "`id`", "w'1", "w\"1",
                                "..", "w1|x", "w1&", "w1>f", "-p2222"}) {
    expect_error([&] { parse_hostfile("ok slots=1\n" + bad + " slots=2\n", "hf"); },
                 "hf:2: host name '" + bad + "' " + rule);
  }
  expect_error([] { parse_node_spec("a@$(id):0", "--include"); },
               "--include 'a@$(id):0': host name '$(id)' " + rule);
  // Names DNS and DeepSpeed's hostfiles use pass.
  EXPECT_EQ(parse_hostfile("node-1.cluster_a slots=1\n10.0.0.2 slots=1\n", "hf").size(), 2u);
}

TEST(Hostfile, IncludeKeepsNamedSlotsInPoolOrder) {
  EXPECT_EQ(filter_resources(kPool, "a:0,2@b", ""), (Resources{{"a", {0, 2}}, {"b", {0, 1}}}));
  // Hosts come in hostfile order whatever the spec's order; slots keep the written order, duplicates dropped.
  EXPECT_EQ(filter_resources(kPool, "c@a:3,1,3", ""), (Resources{{"a", {3, 1}}, {"c", {0}}}));
  EXPECT_EQ(filter_resources(kPool, "", ""), kPool);
}

TEST(Hostfile, ExcludeRemovesSlotsAndEmptyHosts) {
  EXPECT_EQ(filter_resources(kPool, "", "a:1@c"), (Resources{{"a", {0, 2, 3}}, {"b", {0, 1}}}));
  EXPECT_EQ(filter_resources(kPool, "", "b:0,1"), (Resources{{"a", {0, 1, 2, 3}}, {"c", {0}}}));
}

TEST(Hostfile, FilterErrorsNameTheHostOrSlot) {
  expect_error([] { filter_resources(kPool, "a", "b"); },
               "--include and --exclude are mutually exclusive; give one of them");
  expect_error([] { filter_resources(kPool, "a@zz", ""); }, "--include: host 'zz' is not in the hostfile");
  expect_error([] { filter_resources(kPool, "", "b:2"); }, "--exclude: host 'b' has no slot 2 (it has 2 slots)");
  expect_error([] { filter_resources(kPool, "a:x", ""); },
               "--include 'a:x': bad slot 'x' (expected a non-negative integer)");
  expect_error([] { filter_resources(kPool, "a:", ""); },
               "--include 'a:': bad slot '' (expected a non-negative integer)");
  expect_error([] { filter_resources(kPool, "a@", ""); },
               "--include 'a@': empty host name (expected NAME[:SLOT,...][@NAME...])");
  expect_error([] { filter_resources(kPool, "", "a@b@c"); }, "--exclude leaves no slot to run on");
}

TEST(Hostfile, NodeSpecRoundTrips) {
  const Resources world = {{"h1", {0, 1}}, {"10.0.0.2", {2, 0}}};
  EXPECT_EQ(format_node_spec(world), "h1:0,1@10.0.0.2:2,0");
  EXPECT_EQ(parse_node_spec(format_node_spec(world), "--world_info"), world);
}

}  // namespace
}  // namespace dscpp::launcher
