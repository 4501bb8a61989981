/* The system-call floor under a store's image build: open + fstat + flock every tensor file,
 * reserve one range and map each file into it, the way burn-mapped's `image` does, with
 * nothing else (no manifest, no header encoding, no Burn). Variants: without the huge-page
 * advice, mapping in reverse order, mapping into a released range with MAP_FIXED_NOREPLACE
 * (no reservation split), and opening relative to a directory descriptor.
 *
 *   cc -O2 -o map_floor benches/scripts/map_floor.c
 *   ./map_floor ~/.cache/burn-mapped/stores/<store> [iterations]
 *
 * Tensor files are every file of the directory except manifest.json, in name order; a file of
 * at least 2 MiB starts on a 2 MiB boundary. Prints median and minimum build and teardown
 * times per variant. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/file.h>
#include <time.h>
#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif
#define HP (2UL<<20)
#define AL (16UL<<10)
static char *names[4096]; static size_t lens[4096]; static int n;
static int cmp(const void*a,const void*b){return strcmp(*(char**)a,*(char**)b);}
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e3+t.tv_nsec/1e6;}
static size_t up(size_t x,size_t a){return (x+a-1)/a*a;}
int fds[4096]; size_t slots[4096]; size_t total;
static void layout(){size_t off=AL; for(int i=0;i<n;i++){ if(lens[i]>=HP) off=up(off,HP); slots[i]=off; off+=lens[i];} total=off;}
static char dirp[4096]; static int dfd=-1;
static void openall(int lock){char pth[8192]; for(int i=0;i<n;i++){ if(dfd>=0) fds[i]=openat(dfd,names[i],O_RDONLY|O_CLOEXEC|O_NOFOLLOW); else {snprintf(pth,sizeof pth,"%s/%s",dirp,names[i]); fds[i]=open(pth,O_RDONLY|O_CLOEXEC|O_NOFOLLOW);} struct stat st; fstat(fds[i],&st); if(lock) flock(fds[i],LOCK_SH|LOCK_NB);}}
static void closeall(){for(int i=0;i<n;i++) close(fds[i]);}
static char* reserve(){size_t over=total+HP; char*r=mmap(0,over,PROT_READ,MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE,-1,0); size_t s=(size_t)r,a=up(s,HP); if(a>s) munmap(r,a-s); if(s+over>a+total) munmap((char*)a+total,s+over-a-total); return (char*)a;}
static void hdr(char*b){mmap(b,AL,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS|MAP_FIXED,-1,0); b[0]=1; mprotect(b,AL,PROT_READ);}
static char* stratA(int adv){char*b=reserve(); hdr(b); for(int i=0;i<n;i++){void*p=mmap(b+slots[i],lens[i],PROT_READ,MAP_SHARED|MAP_FIXED,fds[i],0); if(p==MAP_FAILED){perror("A");exit(1);} if(adv&&lens[i]>=HP) madvise(p,lens[i],MADV_HUGEPAGE);} return b;}
/* reverse order: split at the end of the remaining reservation */
static char* stratR(int adv){char*b=reserve(); hdr(b); for(int i=n-1;i>=0;i--){void*p=mmap(b+slots[i],lens[i],PROT_READ,MAP_SHARED|MAP_FIXED,fds[i],0); if(p==MAP_FAILED){perror("R");exit(1);} if(adv&&lens[i]>=HP) madvise(p,lens[i],MADV_HUGEPAGE);} return b;}
static char* stratB(int adv){char*b=reserve(); munmap(b,total);
  void*h=mmap(b,AL,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS|MAP_FIXED_NOREPLACE,-1,0); if(h!=b){perror("Bh");exit(1);} b[0]=1; mprotect(b,AL,PROT_READ);
  size_t end=AL;
  for(int i=0;i<n;i++){ if(slots[i]>end){void*g=mmap(b+end,slots[i]-end,PROT_READ,MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE|MAP_FIXED_NOREPLACE,-1,0); if(g==MAP_FAILED){perror("Bg");exit(1);}}
    void*p=mmap(b+slots[i],lens[i],PROT_READ,MAP_SHARED|MAP_FIXED_NOREPLACE,fds[i],0); if(p!=b+slots[i]){perror("B");exit(1);} if(adv&&lens[i]>=HP) madvise(p,lens[i],MADV_HUGEPAGE); end=slots[i]+lens[i];}
  return b;}
int main(int argc,char**argv){ strcpy(dirp,argv[1]); if(chdir(argv[1])) return 1; DIR*d=opendir("."); struct dirent*e; while((e=readdir(d))){ if(e->d_name[0]=='.'||!strcmp(e->d_name,"manifest.json")) continue; names[n++]=strdup(e->d_name);} qsort(names,n,sizeof(char*),cmp);
  for(int i=0;i<n;i++){struct stat st; stat(names[i],&st); lens[i]=st.st_size;} layout();
  int it=argc>2?atoi(argv[2]):40; printf("%d files, image %.1f MiB\n",n,total/1048576.0);
  const char*nm[]={"open+fstat+flock","A reserve+MAP_FIXED+adv","A no advise","R reverse order+adv","B noreplace+gapfill+adv","openat: open+fstat+flock","openat: A"};
  for(int s=0;s<7;s++){ if(s>=5){ dfd=open(dirp,O_PATH|O_DIRECTORY|O_CLOEXEC);}  double tb[200],tt[200]; for(int k=0;k<it;k++){ double t0=now(); openall(1); char*b=0;
      if(s==1) b=stratA(1); else if(s==2) b=stratA(0); else if(s==3) b=stratR(1); else if(s==4) b=stratB(1); else if(s==6) b=stratA(1);
      double t1=now(); if(b) munmap(b,total); closeall(); double t2=now(); tb[k]=t1-t0; tt[k]=t2-t1;}
    /* median */ for(int i=0;i<it;i++)for(int j=i+1;j<it;j++){if(tb[j]<tb[i]){double x=tb[i];tb[i]=tb[j];tb[j]=x;} if(tt[j]<tt[i]){double x=tt[i];tt[i]=tt[j];tt[j]=x;}}
    printf("%-28s build med %.3f ms (min %.3f)  teardown med %.3f ms\n",nm[s],tb[it/2],tb[0],tt[it/2]);}
}
