// glog's LOG, VLOG and CHECK for the engine: include this header instead of <glog/logging.h>.
//
// A LibTorch built without glog (pip's wheels) defines macros of the same names in
// c10/util/Logging.h, which LibTorch's headers include. The definition read last wins, and c10's
// LOG(INFO) is silent below c10's own threshold (WARNING), so `engine run -v` lost the trainer's
// lines there. Here c10's header is read first (it is never read twice) and glog's after it, so
// glog's macros stand whatever the file includes next. With Debian's LibTorch, built with glog,
// c10's header is glog's and there is nothing to undo.
#pragma once

#include <c10/util/Logging.h>

#ifndef C10_USE_GLOG
#undef LOG
#undef LOG_IF
#undef VLOG
#undef VLOG_IF
#undef VLOG_IS_ON
#undef CHECK
#undef DCHECK
#undef DLOG
#endif

#include <glog/logging.h>
