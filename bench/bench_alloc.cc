// bench_alloc.cc — host cost of gpupool's allocate+free against jemalloc's mallocx+dallocx.
//
// Google Benchmark drives both allocators through the same workloads in the same run; jemalloc is the
// host-side floor (it manages host memory with thread caches, gpupool manages simulated device memory
// with stream-ordered caches, so jemalloc bounds from below what a cached pair can cost on the host).
//
//   pair/<alloc>/size:S/streams:K/threads:T   allocate S bytes and free it, on one of K streams per thread
//   mix/<alloc>/streams:K/threads:T           the same pair with sizes drawn in order from a real trace
//   window/<alloc>/threads:T                  64 allocations from the trace's sizes live, then freed
//                                             oldest first (splitting and coalescing in the cache)
//   handoff/<alloc>/size:S/threads:2          forward and backward on two threads, one stream: thread 0
//                                             allocates two blocks, frees one and hands the other to
//                                             thread 1, which frees it and allocates and frees one of
//                                             its own (PyTorch runs a device's backward on a thread of
//                                             its own: blocks of one thread's cache freed by another)
//
// The trace sizes come from ../shared/traces/llm_finetune.csv (relative to the source tree; another
// trace with GPUPOOL_BENCH_TRACE=PATH); the mix and window benchmarks are skipped with a message when
// it is absent. Streams mean nothing to jemalloc; its pair runs once per thread count (streams:1).
//
// After the run a table gives gpupool / jemalloc for every workload that ran on both (target: a cached
// pair within 2x of jemalloc's on the same sizes). All gpupool work goes to one pool on the sim
// (device_memory 80 GiB, nothing touched), shared by the benchmark threads, each on its own streams.
#include <benchmark/benchmark.h>
#include <jemalloc/jemalloc.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "gpupool.h"
#include "gpupool_sim.h"

#ifndef GP_TRACES_DIR
#define GP_TRACES_DIR "../shared/traces"
#endif

namespace {

constexpr int kMaxThreads = 2;
constexpr int kMaxStreams = 4;
constexpr size_t kWindow = 64;

gp_pool *g_pool = nullptr;
gp_stream g_streams[kMaxThreads][kMaxStreams];
std::vector<size_t> g_mix;  // allocation sizes of the trace, in trace order
std::string g_mix_source;

void die(const char *what)
{
    std::fprintf(stderr, "bench_alloc: %s: %s\n", what, gp_last_error());
    std::exit(1);
}

// Reads the Size column of the trace's allocate lines.
bool load_mix(const std::string &path)
{
    std::ifstream in(path);
    if (!in)
        return false;
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
        std::stringstream ss(line);
        std::string f[6];
        for (int i = 0; i < 6 && std::getline(ss, f[i], ','); i++) {
        }
        if (f[2] == "allocate") {
            size_t s = std::strtoull(f[4].c_str(), nullptr, 10);
            if (s > 0)
                g_mix.push_back(s);
        }
    }
    return !g_mix.empty();
}

// ---- allocators behind one interface ----------------------------------------------------------

struct Gpupool {
    static void *alloc(size_t size, gp_stream s)
    {
        void *p;
        if (gp_alloc(g_pool, &p, size, s) != GP_OK)
            die("gp_alloc");
        return p;
    }
    static void release(void *p, gp_stream s)
    {
        if (gp_free(g_pool, p, s) != GP_OK)
            die("gp_free");
    }
};

struct Jemalloc {
    static void *alloc(size_t size, gp_stream)
    {
        void *p = mallocx(size, 0);
        if (p == nullptr) {
            std::fprintf(stderr, "bench_alloc: mallocx(%zu) failed\n", size);
            std::exit(1);
        }
        return p;
    }
    static void release(void *p, gp_stream) { dallocx(p, 0); }
};

// ---- workloads --------------------------------------------------------------------------------

template <class A>
void BM_pair(benchmark::State &state, size_t size, int streams)
{
    gp_stream *mine = g_streams[state.thread_index()];
    int k = 0;
    for (auto _ : state) {
        void *p = A::alloc(size, mine[k]);
        benchmark::DoNotOptimize(p);
        A::release(p, mine[k]);
        if (++k == streams)
            k = 0;
    }
    state.SetItemsProcessed(state.iterations());
}

template <class A>
void BM_mix(benchmark::State &state, int streams)
{
    if (g_mix.empty()) {
        state.SkipWithError(("no trace for the size mix: " + g_mix_source).c_str());
        for (auto _ : state) {
        }
        return;
    }
    gp_stream *mine = g_streams[state.thread_index()];
    const size_t n = g_mix.size();
    size_t i = static_cast<size_t>(state.thread_index()) * (n / 2);  // threads start at different places
    int k = 0;
    for (auto _ : state) {
        if (i >= n)
            i = 0;
        void *p = A::alloc(g_mix[i++], mine[k]);
        benchmark::DoNotOptimize(p);
        A::release(p, mine[k]);
        if (++k == streams)
            k = 0;
    }
    state.SetItemsProcessed(state.iterations());
}

template <class A>
void BM_window(benchmark::State &state)
{
    if (g_mix.empty()) {
        state.SkipWithError(("no trace for the size mix: " + g_mix_source).c_str());
        for (auto _ : state) {
        }
        return;
    }
    gp_stream s = g_streams[state.thread_index()][0];
    const size_t n = g_mix.size();
    size_t i = static_cast<size_t>(state.thread_index()) * (n / 2);
    void *live[kWindow];
    for (auto _ : state) {
        for (size_t j = 0; j < kWindow; j++) {
            if (i >= n)
                i = 0;
            live[j] = A::alloc(g_mix[i++], s);
        }
        benchmark::DoNotOptimize(live);
        for (size_t j = 0; j < kWindow; j++)
            A::release(live[j], s);
    }
    // one item = one allocate+free pair, as in the other workloads
    state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(kWindow));
}

// The handoff's ring: slot i holds a block from thread 0 for thread 1, or nullptr. Each thread walks
// the slots in order (one producer, one consumer); a full slot makes the producer free its block
// itself, an empty one makes the consumer go on, so neither ever waits for the other.
constexpr size_t kRing = 256;
std::atomic<void *> g_ring[kRing];
std::atomic<int> g_handoff_done{0};

template <class A>
void BM_handoff(benchmark::State &state, size_t size)
{
    gp_stream s = g_streams[0][0];
    size_t at = 0;
    if (state.thread_index() == 0) {
        for (auto _ : state) {
            void *kept = A::alloc(size, s);
            void *temp = A::alloc(size, s);
            benchmark::DoNotOptimize(temp);
            A::release(temp, s);
            void *empty = nullptr;
            if (g_ring[at].compare_exchange_strong(empty, kept))
                at = (at + 1) % kRing;
            else
                A::release(kept, s);
        }
    } else {
        for (auto _ : state) {
            void *handed = g_ring[at].exchange(nullptr);
            if (handed != nullptr) {
                A::release(handed, s);
                at = (at + 1) % kRing;
            }
            void *temp = A::alloc(size, s);
            benchmark::DoNotOptimize(temp);
            A::release(temp, s);
        }
    }
    // one item = one allocate+free pair: thread 0 makes two a turn, thread 1 one
    state.SetItemsProcessed(state.iterations() * (state.thread_index() == 0 ? 2 : 1));
    if (g_handoff_done.fetch_add(1) % 2 == 1)  // the second to finish frees what is still in the ring
        for (auto &slot : g_ring)
            if (void *left = slot.exchange(nullptr))
                A::release(left, s);
}

void register_all()
{
    const size_t sizes[] = {512, 4 << 10, 64 << 10, 1 << 20, 8 << 20, 64 << 20};
    for (int threads = 1; threads <= kMaxThreads; threads++) {
        for (size_t size : sizes) {
            for (int streams : {1, kMaxStreams}) {
                std::string args = "/size:" + std::to_string(size) + "/streams:" + std::to_string(streams);
                benchmark::RegisterBenchmark(("pair/gpupool" + args).c_str(), BM_pair<Gpupool>, size, streams)
                    ->Threads(threads)
                    ->UseRealTime();
                if (streams == 1)
                    benchmark::RegisterBenchmark(("pair/jemalloc" + args).c_str(), BM_pair<Jemalloc>, size,
                                                 streams)
                        ->Threads(threads)
                        ->UseRealTime();
            }
        }
        for (int streams : {1, kMaxStreams}) {
            std::string args = "/streams:" + std::to_string(streams);
            benchmark::RegisterBenchmark(("mix/gpupool" + args).c_str(), BM_mix<Gpupool>, streams)
                ->Threads(threads)
                ->UseRealTime();
            if (streams == 1)
                benchmark::RegisterBenchmark(("mix/jemalloc" + args).c_str(), BM_mix<Jemalloc>, streams)
                    ->Threads(threads)
                    ->UseRealTime();
        }
        benchmark::RegisterBenchmark("window/gpupool", BM_window<Gpupool>)->Threads(threads)->UseRealTime();
        benchmark::RegisterBenchmark("window/jemalloc", BM_window<Jemalloc>)->Threads(threads)->UseRealTime();
    }
    for (size_t size : {size_t{512}, size_t{4} << 10}) {
        std::string args = "/size:" + std::to_string(size);
        benchmark::RegisterBenchmark(("handoff/gpupool" + args).c_str(), BM_handoff<Gpupool>, size)
            ->Threads(2)
            ->UseRealTime();
        benchmark::RegisterBenchmark(("handoff/jemalloc" + args).c_str(), BM_handoff<Jemalloc>, size)
            ->Threads(2)
            ->UseRealTime();
    }
}

// Keeps every run's time per item so that the ratio table can be printed after the console output.
class RatioReporter : public benchmark::ConsoleReporter {
  public:
    void ReportRuns(const std::vector<Run> &runs) override
    {
        // with --benchmark_repetitions the median aggregate is used, else the single run
        for (const Run &r : runs) {
            bool median = r.run_type == Run::RT_Aggregate && r.aggregate_name == "median";
            if (r.error_occurred || (r.run_type != Run::RT_Iteration && !median))
                continue;
            auto it = r.counters.find("items_per_second");
            if (it == r.counters.end() || it->second.value <= 0)
                continue;
            std::string name = r.run_name.str();
            if (!median && from_median_.count(name))
                continue;
            // items_per_second sums the threads; per-thread ns per pair is threads / rate
            ns_per_item_[name] = 1e9 * static_cast<double>(r.threads) / it->second.value;
            if (median)
                from_median_.insert(name);
        }
        ConsoleReporter::ReportRuns(runs);
    }

    void PrintRatios() const
    {
        std::printf("\ngpupool / jemalloc, ns per allocate+free pair per thread (target: cached pair <= 2x)\n");
        std::printf("%-58s %9s %9s %7s\n", "workload (gpupool side)", "gpupool", "jemalloc", "ratio");
        double worst = 0.0;
        std::string worst_name;
        for (const auto &kv : ns_per_item_) {
            const std::string &name = kv.first;
            size_t at = name.find("/gpupool");
            if (at == std::string::npos)
                continue;
            std::string other = name;
            other.replace(at, 8, "/jemalloc");
            // jemalloc ran with streams:1 only; compare every stream count against it
            size_t st = other.find("/streams:");
            if (st != std::string::npos) {
                size_t end = other.find('/', st + 1);
                other.replace(st, (end == std::string::npos ? other.size() : end) - st, "/streams:1");
            }
            auto j = ns_per_item_.find(other);
            if (j == ns_per_item_.end())
                continue;
            double ratio = kv.second / j->second;
            std::printf("%-58s %9.1f %9.1f %7.2f\n", name.c_str(), kv.second, j->second, ratio);
            if (name.rfind("pair/", 0) == 0 && name.find("/streams:1/") != std::string::npos && ratio > worst) {
                worst = ratio;
                worst_name = name;
            }
        }
        if (!worst_name.empty())
            std::printf("worst cached pair on one stream: %.2fx (%s): target <= 2x %s\n", worst, worst_name.c_str(),
                        worst <= 2.0 ? "MET" : "MISSED");
    }

  private:
    std::map<std::string, double> ns_per_item_;
    std::set<std::string> from_median_;
};

}  // namespace

int main(int argc, char **argv)
{
    const char *env = std::getenv("GPUPOOL_BENCH_TRACE");
    g_mix_source = env && env[0] ? env : std::string(GP_TRACES_DIR) + "/llm_finetune.csv";
    if (!load_mix(g_mix_source))
        std::fprintf(stderr, "bench_alloc: %s is absent: the mix and window benchmarks are skipped\n",
                     g_mix_source.c_str());
    else
        std::fprintf(stderr, "bench_alloc: size mix of %zu allocations from %s\n", g_mix.size(),
                     g_mix_source.c_str());

    if (gp_pool_create(&g_pool, 0, "sim", "device_memory:80GiB") != GP_OK)
        die("gp_pool_create");
    gp_sim *sim = gp_sim_of(g_pool);
    for (auto &row : g_streams)
        for (auto &s : row)
            s = gp_sim_stream_create(sim);

    register_all();
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv))
        return 1;
    RatioReporter reporter;
    benchmark::RunSpecifiedBenchmarks(&reporter);
    reporter.PrintRatios();
    benchmark::Shutdown();

    gp_stats st;
    std::memset(&st, 0, sizeof st);
    st.size = sizeof st;
    st.version = GP_STATS_VERSION;
    if (gp_get_stats(g_pool, &st) == GP_OK)
        std::printf("pool after the run: %llu device allocations, peak reserved %llu bytes\n",
                    static_cast<unsigned long long>(st.num_device_allocs),
                    static_cast<unsigned long long>(st.reserved_bytes_peak));
    gp_pool_destroy(g_pool, nullptr);
    return 0;
}
