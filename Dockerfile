# The one image of docker-compose.yml: web (gunicorn), Celery worker and Celery beat all run ticketrec.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /app

# The versions of requirements.lock, as the Makefile installs them: the CPU build of torch (torch==2.13.0+cpu,
# from the PyTorch CPU index) first, so nothing pulls a CUDA build, then the package with the same constraints.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
COPY requirements.lock ./
RUN pip install --extra-index-url "$TORCH_INDEX" -c requirements.lock torch

COPY setup.cfg pyproject.toml README.md ./
COPY recommender ./recommender
COPY topic_models ./topic_models
COPY workers ./workers
COPY web ./web
RUN pip install --extra-index-url "$TORCH_INDEX" -c requirements.lock '.[pretrained]'

RUN useradd --create-home --uid 1000 ticketrec && mkdir -p /data && chown ticketrec /data
USER ticketrec
ENV TICKETREC_HOME=/data
VOLUME ["/data"]
EXPOSE 8000
CMD ["ticketrec", "--help"]
