#!/usr/bin/env bash
# Builds the Docker images and runs the test suite inside each (the image's
# default command), then prints each image's size and test result.
#
#   docker/build_and_test.sh              # both: rlds_writer:lean and rlds_writer:all
#   docker/build_and_test.sh lean         # only the default (lean) image
#   docker/build_and_test.sh all          # only the image with every extra
#
# lean: the default EXTRAS (gymnasium,reader,plot,convert,test); all: EXTRAS=all,test.
# Environment:
#   DOCKER_NETWORK   network for the build (default: host, where pip reaches the
#                    index through the host's settings)
#   PYTEST_ARGS      arguments for pytest instead of the default "-q"
# Exits non-zero if a build or a test run fails.
set -uo pipefail
cd "$(dirname "$0")/.."

variants=("$@")
[[ ${#variants[@]} -eq 0 ]] && variants=(lean all)
network=${DOCKER_NETWORK:-host}
status=0
summary=()

for variant in "${variants[@]}"; do
  case $variant in
    lean) build_args=() ;;
    all) build_args=(--build-arg EXTRAS=all,test) ;;
    *) echo "unknown variant '$variant': expected lean or all" >&2; exit 2 ;;
  esac
  tag=rlds_writer:$variant
  echo "=== building $tag"
  if ! nice docker build --network "$network" -f docker/Dockerfile "${build_args[@]}" -t "$tag" .; then
    summary+=("$tag: build FAILED")
    status=1
    continue
  fi
  size=$(docker image ls "$tag" --format '{{.Size}}')
  echo "=== testing $tag ($size)"
  log=$(mktemp)
  # shellcheck disable=SC2086  # PYTEST_ARGS is a list of words
  nice docker run --rm --shm-size=2g "$tag" .venv/bin/python -m pytest ${PYTEST_ARGS:--q} 2>&1 \
    | tee "$log"
  rc=${PIPESTATUS[0]}
  result=$(grep -E '^(=+ )?[0-9]+ (passed|failed)|no tests ran' "$log" | tail -n 1)
  rm -f "$log"
  summary+=("$tag: $size, pytest exit $rc: ${result:-no summary line}")
  [[ $rc -eq 0 ]] || status=1
done

echo "=== summary"
printf '%s\n' "${summary[@]}"
exit $status
