// Eager compiles: an HLO written through the mount compiles with no reader, unless its
// writer was killed mid-write.
#include "fuse_test.hpp"

using namespace fusetest;  // the library, the mount fixture, chrono literals

TEST_CASE("writing an HLO through the mount starts its compile with no reader", "[fuse]") {
  Mount m;
  auto dir = m.mnt() / "neuronxcc-2.21.0" / "MODULE_e+0";
  fs::create_directories(dir);
  test::spit(dir / "compile_flags.json", R"(["-O1"])");
  fs::copy_file(test::k_corpus / "spu_tf_jit_comp.hlo.pb", dir / "model.hlo_module.pb");
  auto done = m.backing() / "neuronxcc-2.21.0" / "MODULE_e+0" / "model.done";
  for (int i = 0; i < 1000 && !fs::exists(done); ++i) std::this_thread::sleep_for(10ms);
  CHECK(fs::exists(done));
  auto neff = fake::parse_fake_neff(test::slurp(m.backing() / "neuronxcc-2.21.0" / "MODULE_e+0" / "model.neff"));
  REQUIRE(neff.has_value());
  CHECK(neff->flags == R"(["--target=trn1", "-O1"])");
  CHECK(m.compiles() == 1);
}

TEST_CASE("an HLO whose writer was killed mid-write starts no compile; one closed or left at exit does", "[fuse]") {
  Mount m;
  const auto hlo = test::k_corpus / "rocm08_normal_9.hlo_proto.pb";
  for (std::string name : {"cut", "exited"}) fs::create_directories(m.mnt() / "neuronxcc-2.21.0" / ("MODULE_" + name));
  const auto cut = m.mnt() / "neuronxcc-2.21.0/MODULE_cut";
  const auto exited = m.mnt() / "neuronxcc-2.21.0/MODULE_exited";
  // Half the graph written, the file still open, then SIGKILL: the kernel closes it.
  test::Child writer({"sh", "-c", fmt::format("exec 3>'{}/model.hlo_module.pb'; head -c {} '{}' >&3; echo written; exec sleep 60",
                                              cut.string(), fs::file_size(hlo) / 2, hlo.string())});
  REQUIRE(writer.line() == "written");
  writer.kill(SIGKILL);
  writer.wait();
  // A whole graph whose writer exits without closing it: the exit closes it.
  REQUIRE(test::run({"sh", "-c", fmt::format("exec 3>'{}/model.hlo_module.pb'; cat '{}' >&3; exit 0", exited.string(),
                                             (test::k_corpus / "gopjrt_tuple.hlo.pb").string())})
              .exit_code == 0);
  // (model.done is looked for in the backing directory: the mount shows a placeholder.)
  const auto done = [&](const char* entry) { return fs::exists(m.backing() / "neuronxcc-2.21.0" / entry / "model.done"); };
  for (int i = 0; i < 500 && !done("MODULE_exited"); ++i) std::this_thread::sleep_for(10ms);
  CHECK(done("MODULE_exited"));
  std::this_thread::sleep_for(300ms);
  CHECK(m.compiles() == 1);  // the exited writer's graph only
  CHECK_FALSE(fs::exists(m.backing() / "neuronxcc-2.21.0/MODULE_cut/model.log"));  // nothing recorded
  // The client runs again and writes the whole graph: that compiles.
  write_plain(cut / "model.hlo_module.pb", test::slurp(hlo));
  for (int i = 0; i < 500 && !done("MODULE_cut"); ++i) std::this_thread::sleep_for(10ms);
  CHECK(done("MODULE_cut"));
  CHECK(m.compiles() == 2);
}
