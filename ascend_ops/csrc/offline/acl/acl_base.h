// Offline stand-in (see ../README.md): the one name of CANN's acl/acl_base.h the binding and the
// launch declarations use.
#pragma once

typedef void *aclrtStream;
