// The translation unit that compiles engine_torch_pch's precompiled header
// (cmake/EngineTorchPch.cmake).
