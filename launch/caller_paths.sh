# shellcheck shell=bash
# Sourced by launch/local_cpu.sh and launch/gpu_host.sh, which cd into the checkout to install it: CONFIG and
# WORKDIR as the caller wrote them. A relative path is taken from the caller's directory (the first argument, the
# $PWD saved before the cd); a CONFIG that is no file there, such as "tiny", is a shipped config's name and stays as
# written.
from_caller() { case "$2" in /*) printf '%s' "$2" ;; *) printf '%s' "$1/$2" ;; esac; }
config_from_caller() { if [ -e "$(from_caller "$1" "$2")" ]; then from_caller "$1" "$2"; else printf '%s' "$2"; fi; }
