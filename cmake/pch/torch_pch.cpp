// Owner of the shared precompiled LibTorch header; compiles to nothing.
