# Part of `cmake --install`: writes the systemd unit (deploy/systemd/inferd.service.in) with the
# binary's path under the prefix given at install time. INFERD_SRC and INFERD_BINDIR are set by
# the install(CODE) before this script.
set(INFERD_INSTALLED_BINARY "${CMAKE_INSTALL_PREFIX}/${INFERD_BINDIR}/inferd")
set(unit "$ENV{DESTDIR}${CMAKE_INSTALL_PREFIX}/lib/systemd/system/inferd.service")
configure_file("${INFERD_SRC}/deploy/systemd/inferd.service.in" "${unit}" @ONLY)
message(STATUS "Installing: ${unit}")
