/* The one Apple SDK header ring's C sources include, for CI's macOS check of tether-client only
 * (.ci/run): a compile check on Linux, with no Apple SDK available. It says what the real header
 * says for macOS on Intel; nothing built with it is ever linked or run. */
#ifndef TETHER_CI_TARGET_CONDITIONALS_H
#define TETHER_CI_TARGET_CONDITIONALS_H
#define TARGET_OS_MAC 1
#define TARGET_OS_OSX 1
#define TARGET_OS_IPHONE 0
#define TARGET_OS_IOS 0
#define TARGET_OS_TV 0
#define TARGET_OS_WATCH 0
#define TARGET_OS_SIMULATOR 0
#endif
