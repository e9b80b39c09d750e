# The pipeline's bucket: private, encrypted, versioned; incomplete multipart uploads (a writer killed
# mid-upload leaves no visible object, but its parts) are aborted after a week. One least-privilege
# policy for the pipeline's role: object read/write/delete and listing in this bucket, nothing else.

variable "bucket_name" {
  type    = string
  default = "hpd-pipeline"
}

variable "pipeline_role_name" {
  type        = string
  description = "IAM role the Airflow workers run as"
}

resource "aws_s3_bucket" "pipeline" {
  bucket = var.bucket_name
}

resource "aws_s3_bucket_public_access_block" "pipeline" {
  bucket                  = aws_s3_bucket.pipeline.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_versioning" "pipeline" {
  bucket = aws_s3_bucket.pipeline.id
  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "pipeline" {
  bucket = aws_s3_bucket.pipeline.id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm = "aws:kms"
    }
    bucket_key_enabled = true
  }
}

resource "aws_s3_bucket_ownership_controls" "pipeline" {
  bucket = aws_s3_bucket.pipeline.id
  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "pipeline" {
  bucket = aws_s3_bucket.pipeline.id
  rule {
    id     = "abort-incomplete-multipart-uploads"
    status = "Enabled"
    filter {}
    abort_incomplete_multipart_upload {
      days_after_initiation = 7
    }
  }
}

data "aws_iam_policy_document" "pipeline" {
  statement {
    sid       = "ListTheBucket"
    actions   = ["s3:ListBucket", "s3:ListBucketMultipartUploads"]
    resources = [aws_s3_bucket.pipeline.arn]
  }
  statement {
    sid = "ReadWriteObjects"
    actions = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload",
    "s3:ListMultipartUploadParts"]
    resources = ["${aws_s3_bucket.pipeline.arn}/*"]
  }
}

resource "aws_iam_role_policy" "pipeline" {
  name   = "hpd-pipeline-bucket"
  role   = var.pipeline_role_name
  policy = data.aws_iam_policy_document.pipeline.json
}

data "aws_iam_policy_document" "tls_only" {
  statement {
    sid       = "DenyInsecureTransport"
    effect    = "Deny"
    actions   = ["s3:*"]
    resources = [aws_s3_bucket.pipeline.arn, "${aws_s3_bucket.pipeline.arn}/*"]
    principals {
      type        = "*"
      identifiers = ["*"]
    }
    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_s3_bucket_policy" "pipeline" {
  bucket = aws_s3_bucket.pipeline.id
  policy = data.aws_iam_policy_document.tls_only.json
}
