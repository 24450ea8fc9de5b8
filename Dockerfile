# The one image of docker-compose.yml: web (gunicorn), Celery worker and Celery beat all run ticketrec.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /app

# CPU-only torch first, so nothing pulls a CUDA build (as the Makefile does)
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0

COPY setup.cfg pyproject.toml README.md ./
COPY recommender ./recommender
COPY topic_models ./topic_models
COPY workers ./workers
COPY web ./web
RUN pip install '.[pretrained]'

RUN useradd --create-home --uid 1000 ticketrec && mkdir -p /data && chown ticketrec /data
USER ticketrec
ENV TICKETREC_HOME=/data
VOLUME ["/data"]
EXPOSE 8000
CMD ["ticketrec", "--help"]
