// The one bound on how deeply a template and the data it renders may nest, and the guard that
// enforces it. The parser, the evaluator, the value printer and the destructors of the syntax
// tree each recurse once per level of nesting, so bounding the levels bounds their stack use
// whatever the input: a hostile or broken template fails with an error instead of a SIGSEGV.
#pragma once

namespace moetier::text::jinja {

// Deepest nesting accepted, counted along one path from the top of the template: a block inside
// a block (an elif counts as one more level), an operand, argument, item or parenthesis of an
// expression inside another (a chain `a + b + c` is as deep as it is long); and in data, a list
// or dict inside another. Real chat templates nest fewer than 30 levels, and messages and tool
// schemas fewer than 20. A level costs a few native frames in the parser and the evaluator, at
// worst (an argument inside an argument) about 1.2 KiB in a Release build and 5.5 KiB under ASan,
// whose frames carry redzones. So parsing and rendering a template nested to this limit, or a
// render nested to RenderLimits::max_depth through macro calls, takes at most ~200 KiB of stack
// in Release and ~700 KiB under ASan: within a worker thread's 1 MiB stack, and far within the
// 8 MiB of a main thread. jinja_limits_test measures it; 256 levels would not fit 1 MiB under
// ASan.
inline constexpr int kMaxNestingDepth = 128;

// Counts one level on `*depth` for its lifetime; exceeded() says whether that level is past
// `limit`. The caller returns its error while the guard is still alive, so the count unwinds
// with the recursion.
class NestingGuard {
 public:
  NestingGuard(int* depth, int limit) : depth_(depth), exceeded_(++*depth > limit) {}
  ~NestingGuard() { --*depth_; }
  NestingGuard(const NestingGuard&) = delete;
  NestingGuard& operator=(const NestingGuard&) = delete;

  bool exceeded() const { return exceeded_; }

 private:
  int* depth_;
  bool exceeded_;
};

}  // namespace moetier::text::jinja
